package integration

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/config"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

// These tests connect delayd the way cmd/delayd does: config.Load reads the DELAYD_NATS_* variables and
// config.Config.NATSOptions turns them into nats.go options. They set the environment, so they do not run in
// parallel.

const (
	secPassword = "s3cret-password-for-test"
	secToken    = "s3cret-token-for-test"
)

// secServer starts a JetStream nats-server on a free loopback port with the authentication or TLS that mod sets,
// and registers its shutdown.
func secServer(t *testing.T, mod func(*server.Options)) *server.Server {
	t.Helper()
	opts := natstest.Options(t.TempDir())
	if mod != nil {
		mod(opts)
	}
	return secStart(t, opts)
}

func secStart(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	if !opts.NoLog {
		srv.ConfigureLogger()
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// secLoad runs config.Load with exactly the DELAYD_* variables of env set.
func secLoad(t *testing.T, env map[string]string) (config.Config, error) {
	t.Helper()
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "DELAYD_") {
			t.Setenv(name, "") // restored after the test
			if err := os.Unsetenv(name); err != nil {
				t.Fatal(err)
			}
		}
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	return config.Load()
}

// secConnect loads the configuration of env and connects with its options, as cmd/delayd does (without retrying,
// so that a refused connection is an error here).
func secConnect(t *testing.T, env map[string]string) (*nats.Conn, error) {
	t.Helper()
	cfg, err := secLoad(t, env)
	if err != nil {
		t.Fatalf("config.Load: %v", err)
	}
	opts, err := cfg.NATSOptions()
	if err != nil {
		t.Fatalf("NATSOptions: %v", err)
	}
	nc, err := nats.Connect(cfg.NATSURL, append(opts, nats.Name("delayd-test"), nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond))...)
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

// secMustConnect is secConnect that fails the test on an error.
func secMustConnect(t *testing.T, env map[string]string) *nats.Conn {
	t.Helper()
	nc, err := secConnect(t, env)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	return nc
}

// secRunDelayd runs a delayd service with levels "1s" on nc and waits until it is ready.
func secRunDelayd(t *testing.T, nc *nats.Conn, policy contract.TargetPolicy) *deliver.Service {
	t.Helper()
	return secRunDelaydTable(t, nc, policy, "1s")
}

// secRunDelaydTable is secRunDelayd with the level table table.
func secRunDelaydTable(t *testing.T, nc *nats.Conn, policy contract.TargetPolicy, table string) *deliver.Service {
	t.Helper()
	svc, err := deliver.New(nc, deliver.Config{Prefix: "delay", Levels: levels.MustParse(table), Targets: policy, Logger: itest.Logger(t), LeaseTTL: itest.LeaseTTL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("delayd Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("delayd did not stop within 30s")
		}
	})
	itest.WaitFor(t, 20*time.Second, "delayd ready", svc.Ready)
	return svc
}

// secExpectDelivery publishes through JetStream on pub to delay.<target> at level 1 and waits until sub receives
// it on target, not before its due time.
func secExpectDelivery(t *testing.T, pub, sub *nats.Conn, target string) {
	t.Helper()
	s, err := sub.SubscribeSync(target)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Unsubscribe() }()
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(pub)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	payload := []byte("payload for " + target)
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "delay." + target, Data: payload, Header: itest.Level(1)}); err != nil {
		t.Fatalf("publish delay.%s: %v", target, err)
	}
	m, err := s.NextMsg(15 * time.Second)
	if err != nil {
		t.Fatalf("no delivery on %s: %v", target, err)
	}
	if string(m.Data) != string(payload) {
		t.Errorf("delivered %q, want %q", m.Data, payload)
	}
	due := parseTime(t, m.Header, "Delay-Due-At")
	if enq := parseTime(t, m.Header, "Delay-Enqueued-At"); due.Sub(enq) != time.Second {
		t.Errorf("due - enqueued = %s, want 1s", due.Sub(enq))
	}
	if now := time.Now(); now.Before(due) {
		t.Errorf("delivered at %s, before due %s", now, due)
	}
}

func TestAuthUserPassword(t *testing.T) {
	srv := secServer(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "delayd", Password: secPassword, Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}}, Subscribe: &server.SubjectPermission{Allow: []string{">"}},
			}},
		}
	})
	env := map[string]string{
		"DELAYD_NATS_URL": srv.ClientURL(), "DELAYD_NATS_USER": "delayd", "DELAYD_NATS_PASSWORD": secPassword,
	}
	nc := secMustConnect(t, env)
	secRunDelayd(t, nc, contract.TargetPolicy{})
	client := secMustConnect(t, env)
	secExpectDelivery(t, client, client, "orders.close")

	t.Run("wrong password", func(t *testing.T) {
		env["DELAYD_NATS_PASSWORD"] = "wrong-" + secPassword
		_, err := secConnect(t, env)
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("connect with a wrong password: %v, want %v", err, nats.ErrAuthorization)
		}
		if strings.Contains(err.Error(), secPassword) {
			t.Errorf("connect error %q holds the password", err)
		}
	})
	t.Run("no password", func(t *testing.T) {
		_, err := secConnect(t, map[string]string{"DELAYD_NATS_URL": srv.ClientURL()})
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("connect without credentials: %v, want %v", err, nats.ErrAuthorization)
		}
	})
}

func TestAuthToken(t *testing.T) {
	srv := secServer(t, func(o *server.Options) { o.Authorization = secToken })
	env := map[string]string{"DELAYD_NATS_URL": srv.ClientURL(), "DELAYD_NATS_TOKEN": secToken}
	nc := secMustConnect(t, env)
	secRunDelayd(t, nc, contract.TargetPolicy{})
	secExpectDelivery(t, nc, secMustConnect(t, env), "orders.close")

	env["DELAYD_NATS_TOKEN"] = "wrong"
	if _, err := secConnect(t, env); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("connect with a wrong token: %v, want %v", err, nats.ErrAuthorization)
	}
}

// TestAuthCreds runs delayd with a .creds file in operator mode: an operator signs an account with JetStream, the
// account signs a user, and the server trusts the operator and resolves the accounts (and the system account
// JetStream needs) from memory.
func TestAuthCreds(t *testing.T) {
	operator, account, user := secKey(t, nkeys.CreateOperator), secKey(t, nkeys.CreateAccount), secKey(t, nkeys.CreateUser)
	sys := secKey(t, nkeys.CreateAccount)
	sysPub := secPublic(t, sys)
	opc := jwt.NewOperatorClaims(secPublic(t, operator))
	opc.SystemAccount = sysPub // JetStream needs the system account
	opJWT, err := opc.Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	opc, err = jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		t.Fatal(err)
	}
	accPub := secPublic(t, account)
	ac := jwt.NewAccountClaims(accPub)
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	accJWT, err := ac.Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	sysJWT, err := jwt.NewAccountClaims(sysPub).Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	resolver := &server.MemAccResolver{}
	for pub, claims := range map[string]string{accPub: accJWT, sysPub: sysJWT} {
		if err := resolver.Store(pub, claims); err != nil {
			t.Fatal(err)
		}
	}
	srv := secServer(t, func(o *server.Options) {
		o.TrustedOperators = []*jwt.OperatorClaims{opc}
		o.AccountResolver = resolver
		o.SystemAccount = sysPub
	})

	creds := func(user nkeys.KeyPair, signer nkeys.KeyPair) string {
		userJWT, err := jwt.NewUserClaims(secPublic(t, user)).Encode(signer)
		if err != nil {
			t.Fatal(err)
		}
		seed, err := user.Seed()
		if err != nil {
			t.Fatal(err)
		}
		b, err := jwt.FormatUserConfig(userJWT, seed)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "user.creds")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	env := map[string]string{"DELAYD_NATS_URL": srv.ClientURL(), "DELAYD_NATS_CREDS": creds(user, account)}
	nc := secMustConnect(t, env)
	secRunDelayd(t, nc, contract.TargetPolicy{})
	secExpectDelivery(t, nc, secMustConnect(t, env), "orders.close")

	// A user signed by an account the server does not know is refused.
	env["DELAYD_NATS_CREDS"] = creds(secKey(t, nkeys.CreateUser), secKey(t, nkeys.CreateAccount))
	if _, err := secConnect(t, env); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("connect with an unknown account's user: %v, want %v", err, nats.ErrAuthorization)
	}
}

// TestAuthNKeySeed runs delayd with an NKey seed file against a server that knows the user's public key.
func TestAuthNKeySeed(t *testing.T) {
	user := secKey(t, nkeys.CreateUser)
	srv := secServer(t, func(o *server.Options) {
		o.Nkeys = []*server.NkeyUser{{Nkey: secPublic(t, user)}}
	})
	seed, err := user.Seed()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"DELAYD_NATS_URL": srv.ClientURL(), "DELAYD_NATS_NKEY_SEED": path}
	nc := secMustConnect(t, env)
	secRunDelayd(t, nc, contract.TargetPolicy{})
	secExpectDelivery(t, nc, secMustConnect(t, env), "orders.close")

	other, err := secKey(t, nkeys.CreateUser).Seed()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, other, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := secConnect(t, env); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("connect with an unknown NKey: %v, want %v", err, nats.ErrAuthorization)
	}
}

func secKey(t *testing.T, create func() (nkeys.KeyPair, error)) nkeys.KeyPair {
	t.Helper()
	kp, err := create()
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

func secPublic(t *testing.T, kp nkeys.KeyPair) string {
	t.Helper()
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// TestAuthTLS runs delayd over mutual TLS: the server verifies client certificates, delayd verifies the server
// with DELAYD_NATS_TLS_CA and presents DELAYD_NATS_TLS_CERT and DELAYD_NATS_TLS_KEY.
func TestAuthTLS(t *testing.T) {
	pki := secPKI(t)
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: pki.serverCert, KeyFile: pki.serverKey, CaFile: pki.ca, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := secServer(t, func(o *server.Options) {
		o.TLS, o.TLSVerify, o.TLSConfig, o.TLSTimeout = true, true, tc, 5
	})
	url := fmt.Sprintf("tls://127.0.0.1:%d", srv.Addr().(*net.TCPAddr).Port)
	env := map[string]string{
		"DELAYD_NATS_URL": url, "DELAYD_NATS_TLS_CA": pki.ca, "DELAYD_NATS_TLS_CERT": pki.clientCert, "DELAYD_NATS_TLS_KEY": pki.clientKey,
	}
	nc := secMustConnect(t, env)
	state, err := nc.TLSConnectionState()
	if err != nil || !state.HandshakeComplete || len(state.PeerCertificates) == 0 || state.PeerCertificates[0].Subject.CommonName != "nats-server" {
		t.Fatalf("connection TLS state = %+v, %v; want a completed handshake with the test server", state, err)
	}
	secRunDelayd(t, nc, contract.TargetPolicy{})
	secExpectDelivery(t, nc, secMustConnect(t, env), "orders.close")

	t.Run("without client certificate", func(t *testing.T) {
		_, err := secConnect(t, map[string]string{"DELAYD_NATS_URL": url, "DELAYD_NATS_TLS_CA": pki.ca})
		if err == nil {
			t.Fatal("connected without a client certificate to a server that verifies clients")
		}
	})
	t.Run("without CA", func(t *testing.T) {
		_, err := secConnect(t, map[string]string{"DELAYD_NATS_URL": url, "DELAYD_NATS_TLS_CERT": pki.clientCert, "DELAYD_NATS_TLS_KEY": pki.clientKey})
		var unknown x509.UnknownAuthorityError
		if !errors.As(err, &unknown) {
			t.Fatalf("connect without the CA: %v, want an unknown-authority error", err)
		}
	})
}

// secPKIFiles are the PEM files of a test CA, a server certificate for 127.0.0.1 and a client certificate.
type secPKIFiles struct {
	ca, serverCert, serverKey, clientCert, clientKey string
}

func secPKI(t *testing.T) secPKIFiles {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	serial := int64(1)
	template := func(cn string) *x509.Certificate {
		serial++
		return &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		}
	}
	caKey := newKey()
	caTmpl := template("delayd test CA")
	caTmpl.IsCA, caTmpl.BasicConstraintsValid = true, true
	caTmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(name, cn string, usage x509.ExtKeyUsage) (string, string) {
		key := newKey()
		tmpl := template(cn)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
		if usage == x509.ExtKeyUsageServerAuth {
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
			tmpl.DNSNames = []string{"localhost"}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "PRIVATE KEY", keyDER)
	}
	f := secPKIFiles{ca: write("ca.pem", "CERTIFICATE", caDER)}
	f.serverCert, f.serverKey = issue("server", "nats-server", x509.ExtKeyUsageServerAuth)
	f.clientCert, f.clientKey = issue("client", "delayd", x509.ExtKeyUsageClientAuth)
	return f
}

// TestAuthConfigErrorsRedacted checks the error rules end to end: a bad creds path is named with its variable, and
// no password or token appears in a configuration or connection error.
func TestAuthConfigErrorsRedacted(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.creds")
	_, err := secLoad(t, map[string]string{"DELAYD_NATS_URL": "nats://127.0.0.1:4222", "DELAYD_NATS_CREDS": missing})
	if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("DELAYD_NATS_CREDS=%q: file does not exist", missing)) {
		t.Errorf("bad creds path: error %v, want it to name DELAYD_NATS_CREDS and %s", err, missing)
	}

	for _, env := range []map[string]string{
		{"DELAYD_NATS_USER": "delayd", "DELAYD_NATS_PASSWORD": secPassword}, // embedded mode
		{"DELAYD_NATS_TOKEN": secToken},                                     // embedded mode
		{"DELAYD_NATS_URL": "nats://127.0.0.1:4222", "DELAYD_NATS_PASSWORD": secPassword},
		{"DELAYD_NATS_URL": "nats://127.0.0.1:4222", "DELAYD_NATS_TOKEN": secToken, "DELAYD_NATS_USER": "u", "DELAYD_NATS_PASSWORD": secPassword},
		{"DELAYD_NATS_URL": "nats://u:" + secPassword + "@127.0.0.1:4222", "DELAYD_NATS_TOKEN": secToken},
		{"DELAYD_NATS_URL": "http://u:" + secPassword + "@127.0.0.1:4222"},
	} {
		_, err := secLoad(t, env)
		if err == nil {
			t.Errorf("Load with %d variables: no error", len(env))
			continue
		}
		if msg := err.Error(); strings.Contains(msg, secPassword) || strings.Contains(msg, secToken) {
			t.Errorf("Load error %q holds a secret", msg)
		} else if !strings.Contains(msg, "DELAYD_NATS_") {
			t.Errorf("Load error %q names no variable", msg)
		}
	}

	// A refused connection says so without the password.
	srv := secServer(t, func(o *server.Options) { o.Username, o.Password = "delayd", secPassword })
	_, err = secConnect(t, map[string]string{"DELAYD_NATS_URL": srv.ClientURL(), "DELAYD_NATS_USER": "delayd", "DELAYD_NATS_PASSWORD": "x" + secPassword})
	if err == nil || strings.Contains(err.Error(), secPassword) {
		t.Errorf("connect with a wrong password: %v, want an error without the password", err)
	}
}

// secReadmeMarker precedes the nats-server permissions example in docs/operations.md#security, which
// TestAuthREADMEPermissions runs.
const secReadmeMarker = "<!-- permissions example: run by TestAuthREADMEPermissions in integration/auth_test.go -->"

// secReadmeBlock returns the fenced code block that follows secReadmeMarker in docs/operations.md.
func secReadmeBlock(t *testing.T) string {
	t.Helper()
	f, err := os.Open("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var block []string
	state := 0 // 0: before the marker, 1: before the fence, 2: in the block
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case state == 0 && strings.TrimSpace(line) == secReadmeMarker:
			state = 1
		case state == 1 && strings.HasPrefix(line, "```"):
			state = 2
		case state == 2 && strings.HasPrefix(line, "```"):
			return strings.Join(block, "\n")
		case state == 2:
			block = append(block, line)
		}
	}
	t.Fatalf("docs/operations.md has no code block after %q", secReadmeMarker)
	return ""
}

// Passwords of the permissions example's users (docs/operations.md#security), which it reads from the server's environment.
const (
	delaydPassword  = "delayd-pw-for-test"
	ordersPassword  = "orders-pw-for-test"
	billingPassword = "billing-pw-for-test"
)

// secReadmeServer starts a nats-server configured with the permissions example of docs/operations.md#security, on a free loopback port.
func secReadmeServer(t *testing.T) *server.Server {
	t.Helper()
	t.Setenv("DELAYD_PASSWORD", delaydPassword) // referenced by the example as $DELAYD_PASSWORD
	t.Setenv("ORDERS_PASSWORD", ordersPassword)
	t.Setenv("BILLING_PASSWORD", billingPassword)
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats-server.conf")
	text := fmt.Sprintf("jetstream {\n  store_dir: %q\n}\n%s\n", filepath.Join(dir, "js"), secReadmeBlock(t))
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("permissions example (docs/operations.md): %v", err)
	}
	opts.Host, opts.Port, opts.NoSigs, opts.NoLog = "127.0.0.1", -1, true, true
	return secStart(t, opts)
}

// TestAuthREADMEPermissions runs the permissions example of docs/operations.md#security: a server configured with it,
// delayd connected as its delayd user with DELAYD_ALLOW_TARGETS matching, and an application user that may only schedule orders.
// It exercises everything delayd does under its user: a level delivery, a cascading Delay-Duration (its hop is a
// publish to the ingress prefix), a dead letter, the id index and a tombstone (a cancel), the offsets bucket, and
// the info, stats and cancel APIs, with their replies; delayd must hit no permissions violation.
func TestAuthREADMEPermissions(t *testing.T) {
	srv := secReadmeServer(t)

	dnc := secMustConnect(t, map[string]string{
		"DELAYD_NATS_URL": srv.ClientURL(), "DELAYD_NATS_USER": "delayd", "DELAYD_NATS_PASSWORD": delaydPassword,
	})
	var (
		mu        sync.Mutex
		asyncErrs []error
	)
	dnc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		mu.Lock()
		asyncErrs = append(asyncErrs, err)
		mu.Unlock()
	})
	svc := secRunDelaydTable(t, dnc, contract.TargetPolicy{Allow: []string{"orders.>", "billing.>"}}, "1s 1h")
	stopStats, err := svc.StartStatsAPI()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stopStats() }()
	// The stats API answers under these permissions (asked here by the delayd user itself).
	if m, err := dnc.Request(contract.StatsSubject, nil, 5*time.Second); err != nil || !strings.Contains(string(m.Data), `"levels"`) {
		t.Errorf("stats API under the permissions example: %v", err)
	}

	orders := secMustConnect(t, map[string]string{
		"DELAYD_NATS_URL": srv.ClientURL(), "DELAYD_NATS_USER": "orders", "DELAYD_NATS_PASSWORD": ordersPassword,
	})
	violations := make(chan error, 16)
	orders.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err })
	secExpectDelivery(t, orders, orders, "orders.close")
	ordersJS, err := jetstream.New(orders)
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer rcancel()

	// The info API answers the orders user (delayd.Publish's client-side checks).
	if info, err := delayd.FetchInfo(rctx, orders); err != nil || info.Prefix != "delay" {
		t.Errorf("info API as the orders user: %+v, %v", info, err)
	}

	// A cascading message: 1.5 s waits at the 1s level, then moves on through the ingress stream (delayd publishes
	// it to delay.orders.remind again) and the precision levels. It arrives, not early, after at least one hop.
	remind, err := orders.SubscribeSync("orders.remind")
	if err != nil {
		t.Fatal(err)
	}
	_ = orders.Flush()
	if _, err := delayd.Publish(rctx, ordersJS, "orders.remind", []byte("cascade"), delayd.WithDuration(1500*time.Millisecond)); err != nil {
		t.Fatalf("publish a cascading message as orders: %v", err)
	}
	if m, err := remind.NextMsg(20 * time.Second); err != nil {
		t.Errorf("cascading message not delivered under the permissions example: %v", err)
	} else {
		due, enq := parseTime(t, m.Header, delayd.HeaderDueAt), parseTime(t, m.Header, delayd.HeaderEnqueuedAt)
		if due.Sub(enq) != 1500*time.Millisecond || time.Now().Before(due) {
			t.Errorf("cascade delivered at %s, enqueued %s, due %s", time.Now(), enq, due)
		}
		if m.Header.Get(delayd.HeaderHops) == "" {
			t.Errorf("cascade delivered without %s: it did not move on", delayd.HeaderHops)
		}
	}

	// A cancel as orders: the router's id index and the scanner's tombstone are written under delayd's user.
	pending, err := delayd.Publish(rctx, ordersJS, "orders.close", []byte("cancel me"), delayd.WithLevel(2))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := delayd.Cancel(rctx, orders, "orders.close", pending); err != nil || r != delayd.Cancelled {
		t.Errorf("orders cancelling its own %s: %q, %v; want cancelled", pending, r, err)
	}

	// A dead letter: an invalid level is written to DELAYD_DLQ.
	if _, err := ordersJS.PublishMsg(rctx, &nats.Msg{Subject: "delay.orders.bad", Data: []byte("bad"), Header: nats.Header{delayd.HeaderLevel: {"x"}}}); err != nil {
		t.Fatal(err)
	}
	djs, err := jetstream.New(dnc)
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := djs.Stream(rctx, deliver.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	itest.WaitFor(t, 15*time.Second, "a dead letter of delay.orders.bad", func() bool {
		m, err := dlq.GetLastMsgForSubject(rctx, "delayd.dlq.level")
		return err == nil && m.Header.Get(delayd.HeaderSubject) == "delay.orders.bad"
	})

	// The offsets bucket holds the 1s level's committed offset.
	kv, err := djs.KeyValue(rctx, "DELAYD_OFFSETS")
	if err != nil {
		t.Fatal(err)
	}
	itest.WaitFor(t, 15*time.Second, "an offset of DELAYD_1S", func() bool {
		e, err := kv.Get(rctx, "DELAYD_1S")
		return err == nil && len(e.Value()) > 0 && string(e.Value()) != "0"
	})

	// The orders user cannot schedule a payment: the server refuses the publish, and the ingress stream does not
	// get it.
	if err := orders.Publish("delay.payments.refund", []byte("x")); err != nil {
		t.Fatal(err)
	}
	_ = orders.Flush()
	select {
	case err := <-violations:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "delay.payments.refund") {
			t.Errorf("publish to delay.payments.refund: %v, want a permissions violation", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("publish to delay.payments.refund was not refused")
	}
	js, err := jetstream.New(dnc)
	if err != nil {
		t.Fatal(err)
	}
	ingress, err := js.Stream(context.Background(), deliver.IngressStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ingress.GetLastMsgForSubject(context.Background(), "delay.payments.refund"); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("ingress holds delay.payments.refund (or the lookup failed): %v", err)
	}

	// delayd itself ran without a permissions violation, and dead-lettered nothing as undeliverable.
	mu.Lock()
	defer mu.Unlock()
	for _, err := range asyncErrs {
		if errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("delayd hit a permissions violation: %v", err)
		}
	}
	if m, err := dlq.GetLastMsgForSubject(rctx, "delayd.dlq.undeliverable"); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("an undeliverable dead letter (or the lookup failed): %v, %v", m, err)
	}
}

// TestAuthREADMECancelScope: under the permissions example of docs/operations.md#security, the orders user cannot cancel a billing
// message, neither by its ingress sequence nor by its (guessed) Nats-Msg-Id, in any of the id's forms: the scoped
// cancel answers "not found" exactly as for an unknown id, and the message is still pending (billing cancels it) or
// delivered. An orders message whose id has the same text as a billing sequence does not make that id ambiguous.
// The status API, granted in the same scope, tells the orders user its own message's state and billing's as "not
// found". A reschedule in its scope answers billing's messages "not found" too, and moves its own. A cancel-all of
// its own target cancels its own message only (the moved one included). The server refuses the orders user's
// requests to billing's scope (cancel, status, list, cancel-all, reschedule) and to the unscoped operator forms, of
// cancel, status and reschedule, and the orders user can still cancel its own messages.
func TestAuthREADMECancelScope(t *testing.T) {
	srv := secReadmeServer(t)
	dnc := secMustConnect(t, map[string]string{
		"DELAYD_NATS_URL": srv.ClientURL(), "DELAYD_NATS_USER": "delayd", "DELAYD_NATS_PASSWORD": delaydPassword,
	})
	svc, err := deliver.New(dnc, deliver.Config{Prefix: "delay", Levels: levels.MustParse("1s 1h"),
		Targets: contract.TargetPolicy{Allow: []string{"orders.>", "billing.>"}}, Logger: itest.Logger(t), LeaseTTL: itest.LeaseTTL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	itest.WaitFor(t, 20*time.Second, "delayd ready", svc.Ready)

	user := func(name, password string) (*nats.Conn, jetstream.JetStream, chan error) {
		nc := secMustConnect(t, map[string]string{"DELAYD_NATS_URL": srv.ClientURL(), "DELAYD_NATS_USER": name, "DELAYD_NATS_PASSWORD": password})
		violations := make(chan error, 16)
		nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err })
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return nc, js, violations
	}
	orders, ordersJS, violations := user("orders", ordersPassword)
	billing, billingJS, _ := user("billing", billingPassword)
	delivered, err := billing.SubscribeSync("billing.>")
	if err != nil {
		t.Fatal(err)
	}
	ordersDelivered, err := orders.SubscribeSync("orders.>")
	if err != nil {
		t.Fatal(err)
	}
	_ = billing.Flush()
	_ = orders.Flush()

	rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer rcancel()
	pub := func(js jetstream.JetStream, target string, lvl int, id string) string {
		t.Helper()
		opts := []delayd.PublishOpt{delayd.WithLevel(lvl)}
		if id != "" {
			opts = append(opts, delayd.WithMsgID(id))
		}
		got, err := delayd.Publish(rctx, js, target, []byte("for "+target), opts...)
		if err != nil {
			t.Fatalf("publish to %s: %v", target, err)
		}
		return got
	}
	cancelAs := func(nc *nats.Conn, target, id string) delayd.CancelResult {
		t.Helper()
		r, err := delayd.Cancel(rctx, nc, target, id)
		if err != nil {
			t.Fatalf("cancel %s %q: %v", target, id, err)
		}
		return r
	}

	statusAs := func(nc *nats.Conn, target, id string) delayd.State {
		t.Helper()
		r, err := delayd.Status(rctx, nc, target, id)
		if err != nil {
			t.Fatalf("status %s %q: %v", target, id, err)
		}
		return r.State
	}

	b1 := pub(billingJS, "billing.charge", 2, "")          // pending an hour; id: its ingress sequence
	b2 := pub(billingJS, "billing.charge", 2, "invoice-7") // pending an hour; a guessable id
	b3 := pub(billingJS, "billing.charge", 1, "")          // delivered in a second
	o1 := pub(ordersJS, "orders.close", 2, "")
	pub(ordersJS, "orders.close", 2, b1) // o2: an orders id with the text of billing's sequence

	// Within its own scope, the orders user finds nothing of billing's: status (granted with cancel, scoped the
	// same way) tells its own message's state and nothing of billing's.
	if st := statusAs(orders, "orders.close", o1); st != delayd.Pending {
		t.Errorf("orders asking the status of its own %s: %q, want pending", o1, st)
	}
	for _, id := range []string{"seq:" + b1, b2, "id:" + b2, "seq:" + b3} {
		if st := statusAs(orders, "orders.close", id); st != delayd.StateNotFound {
			t.Errorf("orders asking the status of billing's %q in its scope: %q, want not found", id, st)
		}
	}
	// Its list of orders.close holds its own two messages, none of billing's.
	page, err := delayd.ListPending(rctx, orders, "orders.close")
	if err != nil {
		t.Fatalf("orders listing orders.close: %v", err)
	}
	if len(page.Items) != 2 || page.Items[0].Target != "orders.close" || page.Items[1].Target != "orders.close" {
		t.Errorf("orders listing orders.close: %+v, want its own two messages", page.Items)
	}
	// Within its own scope, the orders user finds nothing of billing's.
	for _, id := range []string{"seq:" + b1, b2, "id:" + b2, b3, "seq:" + b3} {
		if r := cancelAs(orders, "orders.close", id); r != delayd.NotFound {
			t.Errorf("orders cancelling billing's %q in its scope: %q, want not found", id, r)
		}
	}
	// Nor does a reschedule: billing's messages are not found in orders' scope, and stay where they are.
	for _, id := range []string{"seq:" + b1, b2, "id:" + b2, "seq:" + b3} {
		if r, err := delayd.Reschedule(rctx, orders, "orders.close", id, delayd.Now()); err != nil || r.Result != delayd.RescheduleNotFound {
			t.Errorf("orders rescheduling billing's %q in its scope: %+v %v, want not found", id, r, err)
		}
	}
	// Its own o1 it moves (two hours on): still pending, found by the cancel-all below.
	if r, err := delayd.Reschedule(rctx, orders, "orders.close", o1, delayd.In(2*time.Hour)); err != nil || r.Result != delayd.Rescheduled {
		t.Errorf("orders rescheduling its own %s: %+v %v, want rescheduled", o1, r, err)
	}
	// b1's text names billing's ingress sequence and orders' o2: in orders' scope only o2, so it is cancelled,
	// not refused as ambiguous (which would tell orders that billing has a message there).
	if r := cancelAs(orders, "orders.close", b1); r != delayd.Cancelled {
		t.Errorf("orders cancelling %q (its o2, and billing's sequence): %q, want cancelled", b1, r)
	}
	// Cancel-all of its own target cancels its own pending message (o1, moved; o2 is cancelled already), none of
	// billing's.
	if res, err := delayd.CancelAll(rctx, orders, "orders.close"); err != nil || res != (delayd.CancelAllResult{Cancelled: 1, Complete: true}) {
		t.Errorf("orders cancelling all of orders.close: %+v %v, want its one pending message cancelled", res, err)
	}
	// Billing's messages are untouched: billing itself cancels b1 and b2 now.
	for _, id := range []string{"seq:" + b1, b2} {
		if r := cancelAs(billing, "billing.charge", id); r != delayd.Cancelled {
			t.Errorf("billing cancelling its own %q: %q, want cancelled (orders must not have cancelled it)", id, r)
		}
	}
	// b3 is delivered, whatever orders asked.
	m, err := delivered.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatalf("billing's level-1 message %s not delivered: %v", b3, err)
	}
	if got := m.Header.Get(delayd.HeaderLevel); got != "" {
		t.Errorf("delivered with %s %q", delayd.HeaderLevel, got)
	}

	// The server refuses the orders user's requests to billing's scope and to the unscoped form.
	for _, subject := range []string{delayd.CancelSubjectFor("billing.charge"), delayd.CancelSubject,
		delayd.StatusSubjectFor("billing.charge"), delayd.StatusSubject, delayd.PendingSubjectFor("billing.charge"),
		delayd.CancelAllSubjectFor("billing.charge"), delayd.RescheduleSubjectFor("billing.charge"), delayd.RescheduleSubject} {
		if err := orders.PublishRequest(subject, orders.NewInbox(), []byte(b1)); err != nil {
			t.Fatal(err)
		}
		_ = orders.Flush()
		select {
		case err := <-violations:
			if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), subject) {
				t.Errorf("request to %s: %v, want a permissions violation", subject, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("request to %s was not refused by the server", subject)
		}
	}

	// The orders user still cancels its own message, and it is never delivered.
	if r := cancelAs(orders, "orders.close", o1); r != delayd.Cancelled {
		t.Errorf("orders cancelling its own %s: %q, want cancelled", o1, r)
	}
	if m, err := ordersDelivered.NextMsg(1500 * time.Millisecond); err == nil {
		t.Errorf("orders got a delivery %q on %s: its messages were cancelled or an hour away", m.Data, m.Subject)
	}
}

// TestAuthREADMEDelayctl runs the built delayctl as the orders user of the permissions example (docs/operations.md#security): pub needs only
// what delayd.Publish needs (no JetStream API), cancel works in its own scope, and a request or publish the server
// refuses fails at once with "permission denied" naming the subject, instead of waiting for its timeout.
func TestAuthREADMEDelayctl(t *testing.T) {
	srv := secReadmeServer(t)
	dnc := secMustConnect(t, map[string]string{
		"DELAYD_NATS_URL": srv.ClientURL(), "DELAYD_NATS_USER": "delayd", "DELAYD_NATS_PASSWORD": delaydPassword,
	})
	secRunDelaydTable(t, dnc, contract.TargetPolicy{Allow: []string{"orders.>", "billing.>"}}, "1s 1h")
	orders := map[string]string{
		"DELAYD_NATS_URL": srv.ClientURL(), "DELAYD_NATS_USER": "orders", "DELAYD_NATS_PASSWORD": ordersPassword,
		"DELAYD_LEVELS": "1s 1h",
	}

	pub := itest.DelayctlEnv(t, orders, "pub", "orders.close", "close order 42", "--level", "2")
	pub.Want(t, 0, "published to delay.orders.close")
	id := strings.TrimSpace(pub.Stdout)
	itest.DelayctlEnv(t, orders, "cancel", "orders.close", id).Want(t, 0, "cancelled")

	// Refused by the server: another tenant's cancel scope, the operator's unscoped form, another tenant's
	// ingress subject. Each fails with the violation, not "no answer ... within 30s" or a PubAck timeout.
	for _, tc := range []struct {
		args    []string
		subject string
	}{
		{[]string{"cancel", "billing.charge", id}, "delayd.api.cancel.billing.charge"},
		{[]string{"cancel", "--any", id}, "delayd.api.cancel"},
		{[]string{"pub", "billing.charge", "x", "--level", "1"}, "delay.billing.charge"},
	} {
		r := itest.DelayctlEnv(t, orders, tc.args...)
		r.Want(t, 1, "permission denied", fmt.Sprintf("may not publish to %q", tc.subject))
		if strings.Contains(r.Stderr, "no answer") || strings.Contains(r.Stderr, "timeout") {
			t.Errorf("delayctl %s waited for its timeout: %s", strings.Join(tc.args, " "), r.Stderr)
		}
	}
}

package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/delayd/delayd/contract"
)

// The secrets the tests set; no error or printed Config may contain them.
const (
	testPassword = "pa55-w0rd-never-printed"
	testToken    = "t0ken-never-printed"
)

// writeFile writes content to a new file in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadSecurityValues(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	ca := writeFile(t, dir, "ca.pem", "ca")
	cert := writeFile(t, dir, "cert.pem", "cert")
	key := writeFile(t, dir, "key.pem", "key")
	t.Setenv("DELAYD_NATS_URL", "tls://nats.example.com:4222")
	t.Setenv("DELAYD_NATS_USER", "delayd")
	t.Setenv("DELAYD_NATS_PASSWORD", testPassword)
	t.Setenv("DELAYD_NATS_TLS_CA", ca)
	t.Setenv("DELAYD_NATS_TLS_CERT", cert)
	t.Setenv("DELAYD_NATS_TLS_KEY", key)
	t.Setenv("DELAYD_ALLOW_TARGETS", " orders.>, billing.>\tjobs.*.run ")
	t.Setenv("DELAYD_DENY_TARGETS", "orders.internal.>")

	c, err := Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if c.NATSUser != "delayd" || string(c.NATSPassword) != testPassword || c.NATSTLSCA != ca || c.NATSTLSCert != cert ||
		c.NATSTLSKey != key {
		t.Errorf("Load() = %+v", c)
	}
	want := contract.TargetPolicy{Allow: []string{"orders.>", "billing.>", "jobs.*.run"}, Deny: []string{"orders.internal.>"}}
	if got := c.TargetPolicy(); !reflect.DeepEqual(got, want) {
		t.Errorf("TargetPolicy() = %+v, want %+v", got, want)
	}
}

// TestLoadBadSecurity checks each rule of the authentication, TLS and target variables: the error names the
// variable, the value (a path, a user name, or <redacted>) and what is allowed, and never holds a secret.
func TestLoadBadSecurity(t *testing.T) {
	dir := t.TempDir()
	file := writeFile(t, dir, "file", "x")
	missing := filepath.Join(dir, "missing.creds")
	unreadable := writeFile(t, dir, "unreadable", "x")
	if err := os.Chmod(unreadable, 0); err != nil {
		t.Fatal(err)
	}
	const url = "nats://127.0.0.1:4222"

	tests := []struct {
		name string
		env  map[string]string
		want string // VAR="value": reason, in part
	}{
		{name: "password in embedded mode", env: map[string]string{"DELAYD_NATS_USER": "u", "DELAYD_NATS_PASSWORD": testPassword},
			want: `DELAYD_NATS_PASSWORD="<redacted>": only applies with DELAYD_NATS_URL`},
		{name: "token in embedded mode", env: map[string]string{"DELAYD_NATS_TOKEN": testToken},
			want: `DELAYD_NATS_TOKEN="<redacted>": only applies with DELAYD_NATS_URL: the embedded server has no authentication`},
		{name: "CA in embedded mode", env: map[string]string{"DELAYD_NATS_TLS_CA": file},
			want: `DELAYD_NATS_TLS_CA="` + file + `": only applies with DELAYD_NATS_URL`},
		{name: "user without password", env: map[string]string{"DELAYD_NATS_URL": url, "DELAYD_NATS_USER": "u"},
			want: `DELAYD_NATS_USER="u": needs DELAYD_NATS_PASSWORD too (both or neither)`},
		{name: "password without user", env: map[string]string{"DELAYD_NATS_URL": url, "DELAYD_NATS_PASSWORD": testPassword},
			want: `DELAYD_NATS_PASSWORD="<redacted>": needs DELAYD_NATS_USER too`},
		{name: "two methods", env: map[string]string{"DELAYD_NATS_URL": url, "DELAYD_NATS_TOKEN": testToken, "DELAYD_NATS_CREDS": file},
			want: `DELAYD_NATS_CREDS="` + file + `": DELAYD_NATS_TOKEN is set too: set at most one authentication method`},
		{name: "credentials in the URL too", env: map[string]string{"DELAYD_NATS_URL": "nats://u:" + testPassword + "@h:4222", "DELAYD_NATS_TOKEN": testToken},
			want: `DELAYD_NATS_TOKEN="<redacted>": DELAYD_NATS_URL carries credentials too`},
		{name: "missing creds", env: map[string]string{"DELAYD_NATS_URL": url, "DELAYD_NATS_CREDS": missing},
			want: `DELAYD_NATS_CREDS="` + missing + `": file does not exist`},
		{name: "missing seed", env: map[string]string{"DELAYD_NATS_URL": url, "DELAYD_NATS_NKEY_SEED": missing},
			want: `DELAYD_NATS_NKEY_SEED="` + missing + `": file does not exist`},
		{name: "seed is a directory", env: map[string]string{"DELAYD_NATS_URL": url, "DELAYD_NATS_NKEY_SEED": dir},
			want: `DELAYD_NATS_NKEY_SEED="` + dir + `": is not a regular file`},
		{name: "missing CA", env: map[string]string{"DELAYD_NATS_URL": url, "DELAYD_NATS_TLS_CA": missing},
			want: `DELAYD_NATS_TLS_CA="` + missing + `": file does not exist`},
		{name: "cert without key", env: map[string]string{"DELAYD_NATS_URL": url, "DELAYD_NATS_TLS_CERT": file},
			want: `DELAYD_NATS_TLS_CERT="` + file + `": needs DELAYD_NATS_TLS_KEY too (both or neither)`},
		{name: "key without cert", env: map[string]string{"DELAYD_NATS_URL": url, "DELAYD_NATS_TLS_KEY": file},
			want: `DELAYD_NATS_TLS_KEY="` + file + `": needs DELAYD_NATS_TLS_CERT too`},
		{name: "bad allow pattern", env: map[string]string{"DELAYD_ALLOW_TARGETS": "orders.> a.>.b"},
			want: `DELAYD_ALLOW_TARGETS="orders.> a.>.b": pattern "a.>.b": '>' must be the last token`},
		{name: "bad deny pattern", env: map[string]string{"DELAYD_DENY_TARGETS": "orders..x"},
			want: `DELAYD_DENY_TARGETS="orders..x": pattern "orders..x": empty token`},
	}
	if os.Geteuid() != 0 { // root reads any file
		tests = append(tests, struct {
			name string
			env  map[string]string
			want string
		}{name: "unreadable key", env: map[string]string{"DELAYD_NATS_URL": url, "DELAYD_NATS_TLS_CERT": file, "DELAYD_NATS_TLS_KEY": unreadable},
			want: `DELAYD_NATS_TLS_KEY="` + unreadable + `": file is not readable (permission denied)`})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			_, err := Load()
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Load() error = %v, want %v", err, ErrInvalid)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Load() error = %q, want it to contain %q", err, tt.want)
			}
			assertNoSecret(t, err.Error())
		})
	}
}

func assertNoSecret(t *testing.T, s string) {
	t.Helper()
	for _, secret := range []string{testPassword, testToken} {
		if strings.Contains(s, secret) {
			t.Errorf("%q holds a secret", s)
		}
	}
}

// TestSecretNeverPrinted prints a Config every way a log line or error could.
func TestSecretNeverPrinted(t *testing.T) {
	t.Parallel()

	c := validConfig()
	c.NATSURL = "nats://a:4222"
	c.NATSUser, c.NATSPassword, c.NATSToken = "u", testPassword, testToken
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", slog.Any("password", c.NATSPassword), slog.Any("config", c))
	slog.New(slog.NewTextHandler(&buf, nil)).Info("config", slog.Any("token", c.NATSToken), slog.Any("config", c))
	var js bytes.Buffer
	enc := json.NewEncoder(&js)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(c); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), fmt.Sprint(c.NATSToken),
		fmt.Sprintf("%s %q", c.NATSPassword, c.NATSToken), buf.String(), js.String(),
	} {
		assertNoSecret(t, s)
		if !strings.Contains(s, Redacted) {
			t.Errorf("%q does not say %s", s, Redacted)
		}
	}
	if Secret("").String() != "" {
		t.Errorf(`Secret("").String() = %q, want ""`, Secret("").String())
	}
}

func TestPatternsDecode(t *testing.T) {
	t.Parallel()

	for value, want := range map[string]Patterns{
		"":                     nil,
		" , ":                  nil,
		"a.>":                  {"a.>"},
		"a.> b.*,c\td.e,,f.> ": {"a.>", "b.*", "c", "d.e", "f.>"},
	} {
		var p Patterns
		if err := p.Decode(value); err != nil || !reflect.DeepEqual(p, want) {
			t.Errorf("Decode(%q) = %q, %v; want %q", value, p, err, want)
		}
	}
}

func TestNATSOptions(t *testing.T) {
	t.Parallel()

	apply := func(t *testing.T, c Config) nats.Options {
		t.Helper()
		if err := c.Validate(); err != nil {
			t.Fatalf("Validate: %v", err)
		}
		opts, err := c.NATSOptions()
		if err != nil {
			t.Fatalf("NATSOptions: %v", err)
		}
		o := nats.GetDefaultOptions()
		for _, opt := range opts {
			if err := opt(&o); err != nil {
				t.Fatal(err)
			}
		}
		return o
	}
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		opts, err := validConfig().NATSOptions()
		if opts != nil || err != nil {
			t.Errorf("NATSOptions() = %v, %v; want nil, nil", opts, err)
		}
	})
	t.Run("user", func(t *testing.T) {
		t.Parallel()
		c := validConfig()
		c.NATSURL, c.NATSUser, c.NATSPassword = "nats://a:4222", "u", testPassword
		if o := apply(t, c); o.User != "u" || o.Password != testPassword || o.Secure {
			t.Errorf("options: user %q, password set %v, secure %v", o.User, o.Password == testPassword, o.Secure)
		}
	})
	t.Run("token", func(t *testing.T) {
		t.Parallel()
		c := validConfig()
		c.NATSURL, c.NATSToken = "nats://a:4222", testToken
		if o := apply(t, c); o.Token != testToken {
			t.Error("token not set")
		}
	})
	t.Run("nkey seed", func(t *testing.T) {
		t.Parallel()
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		c := validConfig()
		c.NATSURL, c.NATSNKeySeed = "nats://a:4222", writeFile(t, t.TempDir(), "user.nk", string(seed)+"\n")
		if o := apply(t, c); o.Nkey != pub || o.SignatureCB == nil {
			t.Errorf("options: nkey %q, want %q, and a signature callback", o.Nkey, pub)
		}
	})
}

// TestNATSOptionsBadFile checks that a file of the wrong kind is an error naming the variable and the path, and
// not the file's contents.
func TestNATSOptionsBadFile(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	const content = "SUAM-not-a-seed-but-secret-looking"
	path := writeFile(t, dir, "bad", content+"\n")
	for _, tt := range []struct {
		name string
		set  func(*Config)
	}{
		{"DELAYD_NATS_NKEY_SEED", func(c *Config) { c.NATSNKeySeed = path }},
		{"DELAYD_NATS_CREDS", func(c *Config) { c.NATSCreds = path }},
		{"DELAYD_NATS_TLS_CA", func(c *Config) { c.NATSTLSCA = path }},
		{"DELAYD_NATS_TLS_CERT", func(c *Config) { c.NATSTLSCert, c.NATSTLSKey = path, path }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			c.NATSURL = "nats://a:4222"
			tt.set(&c)
			if err := c.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			_, err := c.NATSOptions()
			var ve *VarError
			if !errors.As(err, &ve) || ve.Var != tt.name || !errors.Is(err, ErrInvalid) {
				t.Fatalf("NATSOptions() error = %v, want a *VarError for %s", err, tt.name)
			}
			if msg := err.Error(); !strings.Contains(msg, tt.name+"="+strconv.Quote(path)) || strings.Contains(msg, content) {
				t.Errorf("NATSOptions() error = %q, want it to name %s=%q and not the contents", msg, tt.name, path)
			}
		})
	}
}

func TestRedactURLs(t *testing.T) {
	t.Parallel()

	for in, want := range map[string]string{
		"nats://a:4222":                             "nats://a:4222",
		"nats://u:" + testPassword + "@a:4222":      "nats://u:xxxxx@a:4222",
		"nats://" + testToken + "@a:4222, b:4222":   "nats://xxxxx@a:4222, b:4222",
		"tls://a:1,nats://u:" + testPassword + "@b": "tls://a:1,nats://u:xxxxx@b",
	} {
		if got := RedactURLs(in); got != want {
			t.Errorf("RedactURLs(%q) = %q, want %q", in, got, want)
		}
	}
	c := validConfig()
	c.NATSURL = "http://" + testToken + "@a:4222"
	if err := c.Validate(); err == nil || strings.Contains(err.Error(), testToken) {
		t.Errorf("Validate() error = %v, want an error without the token", err)
	}
}

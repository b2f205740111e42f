package config

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
)

// NATSAuth is the authentication and TLS configuration of the connection to external NATS servers, embedded in
// [Config] and [Client]. Every field applies only with DELAYD_NATS_URL; see [Config.Validate] and [Config.NATSOptions].
type NATSAuth struct {
	// NATSUser and NATSPassword authenticate to the NATS server(s) of NATSURL with a user name and password
	// ([nats.UserInfo]). Both or neither; only with NATSURL; at most one authentication method.
	// Optional. Default "": none.
	NATSUser     string `envconfig:"DELAYD_NATS_USER"`
	NATSPassword Secret `envconfig:"DELAYD_NATS_PASSWORD"`

	// NATSToken authenticates with a token ([nats.Token]). Only with NATSURL; at most one authentication method.
	// Optional. Default "": none.
	NATSToken Secret `envconfig:"DELAYD_NATS_TOKEN"`

	// NATSNKeySeed is the path of a file holding an NKey user seed ([nats.NkeyOptionFromSeed]); it must be readable
	// at start, and it is read again on every (re)connect. Only with NATSURL; at most one authentication method.
	// Optional. Default "": none.
	NATSNKeySeed string `envconfig:"DELAYD_NATS_NKEY_SEED"`

	// NATSCreds is the path of a .creds file, a user JWT and its NKey seed as nsc writes them
	// ([nats.UserCredentials]); it must be readable at start, and it is read again on every (re)connect. Only with
	// NATSURL; at most one authentication method.
	// Optional. Default "": none.
	NATSCreds string `envconfig:"DELAYD_NATS_CREDS"`

	// NATSTLSCA is the path of a PEM file of CA certificates to verify the server with ([nats.RootCAs]) instead of
	// the system's. Setting it requires TLS. Only with NATSURL.
	// Optional. Default "": the system's roots (and TLS only if the URL or server asks for it).
	NATSTLSCA string `envconfig:"DELAYD_NATS_TLS_CA"`

	// NATSTLSCert and NATSTLSKey are the paths of a PEM client certificate and its private key, for servers that
	// verify clients (mutual TLS, [nats.ClientCert]). Both or neither; setting them requires TLS. Only with NATSURL.
	// Optional. Default "": no client certificate.
	NATSTLSCert string `envconfig:"DELAYD_NATS_TLS_CERT"`
	NATSTLSKey  string `envconfig:"DELAYD_NATS_TLS_KEY"`
}

// Secret is a configuration value that must never be printed: its String, GoString, LogValue and MarshalText
// give "<redacted>" (or "" when empty). Convert it with string(s) to use it.
type Secret string

// Redacted is how a set [Secret] prints.
const Redacted = "<redacted>"

// String returns [Redacted], or "" for an empty secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return Redacted
}

// GoString returns String quoted, so %#v does not print the secret either.
func (s Secret) GoString() string { return strconv.Quote(s.String()) }

// LogValue returns String as a [slog.Value].
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalText returns String.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// connVar is one of the variables that configure the connection to an external NATS server.
type connVar struct {
	name    string
	value   string // the value as printed: a path, a user name, or [Redacted]
	set     bool
	isFile  bool
	authKey string // the authentication method it belongs to, or "" for TLS
}

// connVars returns the connection variables, authentication first, in the order of [authMethods].
func (c Config) connVars() []connVar {
	return []connVar{
		{name: "DELAYD_NATS_USER", value: c.NATSUser, set: c.NATSUser != "", authKey: "user"},
		{name: "DELAYD_NATS_PASSWORD", value: c.NATSPassword.String(), set: c.NATSPassword != "", authKey: "user"},
		{name: "DELAYD_NATS_TOKEN", value: c.NATSToken.String(), set: c.NATSToken != "", authKey: "token"},
		{name: "DELAYD_NATS_NKEY_SEED", value: c.NATSNKeySeed, set: c.NATSNKeySeed != "", isFile: true, authKey: "nkey"},
		{name: "DELAYD_NATS_CREDS", value: c.NATSCreds, set: c.NATSCreds != "", isFile: true, authKey: "creds"},
		{name: "DELAYD_NATS_TLS_CA", value: c.NATSTLSCA, set: c.NATSTLSCA != "", isFile: true},
		{name: "DELAYD_NATS_TLS_CERT", value: c.NATSTLSCert, set: c.NATSTLSCert != "", isFile: true},
		{name: "DELAYD_NATS_TLS_KEY", value: c.NATSTLSKey, set: c.NATSTLSKey != "", isFile: true},
	}
}

// authMethods names the authentication methods, at most one of which may be set.
const authMethods = "DELAYD_NATS_USER with DELAYD_NATS_PASSWORD, DELAYD_NATS_TOKEN, DELAYD_NATS_NKEY_SEED or DELAYD_NATS_CREDS"

// validateSecurity checks the authentication and TLS variables: only with NATSURL, at most one authentication
// method, pairs set together, files readable. It never prints a password or token, only [Redacted].
func (c Config) validateSecurity() []error {
	var errs []error
	bad := func(v connVar, reason string, err error) {
		errs = append(errs, &VarError{Var: v.name, Value: v.value, Reason: reason, Err: err})
	}
	vars := c.connVars()
	byName := make(map[string]connVar, len(vars))
	for _, v := range vars {
		byName[v.name] = v
	}
	if c.NATSURL == "" {
		for _, v := range vars {
			if v.set {
				bad(v, "only applies with DELAYD_NATS_URL: the embedded server has no authentication or TLS "+
					"(unset it, or set DELAYD_NATS_URL)", nil)
			}
		}
		return errs
	}

	pair := func(a, b string) {
		if va, vb := byName[a], byName[b]; va.set != vb.set {
			if !va.set {
				va, vb = vb, va
			}
			bad(va, fmt.Sprintf("needs %s too (both or neither)", vb.name), nil)
		}
	}
	pair("DELAYD_NATS_USER", "DELAYD_NATS_PASSWORD")
	pair("DELAYD_NATS_TLS_CERT", "DELAYD_NATS_TLS_KEY")

	first := ""
	for _, v := range vars {
		if v.authKey == "" || !v.set {
			continue
		}
		switch {
		case first == "":
			first = v.name
		case byName[first].authKey != v.authKey:
			bad(v, fmt.Sprintf("%s is set too: set at most one authentication method (%s)", first, authMethods), nil)
		}
	}
	if first != "" && urlHasUserInfo(c.NATSURL) {
		bad(byName[first], "DELAYD_NATS_URL carries credentials too: put them in one place", nil)
	}

	for _, v := range vars {
		if v.isFile && v.set {
			if reason, err := fileReason(v.value); reason != "" {
				bad(v, reason, err)
			}
		}
	}
	return errs
}

// fileReason returns why path is not a readable regular file, or "".
func fileReason(path string) (string, error) {
	f, err := os.Open(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "file does not exist", nil
	case errors.Is(err, fs.ErrPermission):
		return "file is not readable (permission denied)", nil
	case err != nil:
		return "cannot open the file", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "cannot read the file", err
	}
	if !fi.Mode().IsRegular() {
		return "is not a regular file", nil
	}
	return "", nil
}

// urlHasUserInfo reports whether an entry of the comma-separated server list carries a user, password or token.
func urlHasUserInfo(list string) bool {
	for entry := range strings.SplitSeq(list, ",") {
		if u, err := url.Parse(strings.TrimSpace(entry)); err == nil && u.User != nil {
			return true
		}
	}
	return false
}

// AuthMethod names the authentication method the variables choose, for logs: "user", "token", "nkey", "creds",
// "url" (credentials inside DELAYD_NATS_URL), or "none" (also in embedded mode).
func (c Config) AuthMethod() string {
	switch {
	case c.NATSURL == "":
		return "none"
	case urlHasUserInfo(c.NATSURL):
		return "url"
	case c.NATSUser != "":
		return "user"
	case c.NATSToken != "":
		return "token"
	case c.NATSNKeySeed != "":
		return "nkey"
	case c.NATSCreds != "":
		return "creds"
	}
	return "none"
}

// NATSOptions returns the nats.go options for the authentication and TLS variables, built with nats.go's own
// helpers: [nats.UserInfo], [nats.Token], [nats.NkeyOptionFromSeed], [nats.UserCredentials], [nats.RootCAs] and
// [nats.ClientCert]. In embedded mode (NATSURL "") it returns nil. Call it after [Config.Validate].
//
// It loads every file once, so a file that is not what the variable wants (a seed file without a user seed, a
// .creds file without a JWT and seed, a CA file without PEM certificates, a key that does not match its
// certificate) is a [*VarError] at start, naming the variable and the path, never the file's contents.
func (c Config) NATSOptions() ([]nats.Option, error) {
	if c.NATSURL == "" {
		return nil, nil
	}
	var opts []nats.Option
	fileErr := func(name, path, reason string, err error) error {
		return &VarError{Var: name, Value: path, Reason: reason, Err: err}
	}
	switch {
	case c.NATSUser != "":
		opts = append(opts, nats.UserInfo(c.NATSUser, string(c.NATSPassword)))
	case c.NATSToken != "":
		opts = append(opts, nats.Token(string(c.NATSToken)))
	case c.NATSNKeySeed != "":
		opt, err := nats.NkeyOptionFromSeed(c.NATSNKeySeed)
		if err != nil {
			return nil, fileErr("DELAYD_NATS_NKEY_SEED", c.NATSNKeySeed, "cannot load an NKey user seed (want a file holding an SU... seed)", err)
		}
		opts = append(opts, opt)
	case c.NATSCreds != "":
		opt := nats.UserCredentials(c.NATSCreds)
		var o nats.Options
		err := opt(&o)
		if err == nil {
			_, err = o.UserJWT()
		}
		if err == nil {
			_, err = o.SignatureCB([]byte("delayd"))
		}
		if err != nil {
			return nil, fileErr("DELAYD_NATS_CREDS", c.NATSCreds, "cannot load the credentials (want a .creds file with a user JWT and its NKey seed, as nsc writes it)", err)
		}
		opts = append(opts, opt)
	}
	if c.NATSTLSCA != "" {
		opt := nats.RootCAs(c.NATSTLSCA)
		if err := opt(&nats.Options{}); err != nil {
			return nil, fileErr("DELAYD_NATS_TLS_CA", c.NATSTLSCA, "cannot load CA certificates (want a PEM file)", err)
		}
		opts = append(opts, opt)
	}
	if c.NATSTLSCert != "" || c.NATSTLSKey != "" {
		opt := nats.ClientCert(c.NATSTLSCert, c.NATSTLSKey)
		if err := opt(&nats.Options{}); err != nil {
			return nil, fileErr("DELAYD_NATS_TLS_CERT", c.NATSTLSCert,
				fmt.Sprintf("cannot load the client certificate with DELAYD_NATS_TLS_KEY=%q (want PEM files of a certificate and its private key)", c.NATSTLSKey), err)
		}
		opts = append(opts, opt)
	}
	return opts, nil
}

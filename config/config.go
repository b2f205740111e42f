// Package config reads delayd's configuration from the environment (variables DELAYD_*, read with
// github.com/kelseyhightower/envconfig) and validates it. It is the only package that reads the environment.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/internal/lease"
	"github.com/delayd/delayd/levels"
)

// Defaults of the optional variables.
const (
	// ListenDefault is the default embedded-server client listen address (DELAYD_LISTEN).
	ListenDefault = "127.0.0.1:4222"
	// StoreDirDefault is the default embedded-server JetStream store directory (DELAYD_STORE_DIR).
	StoreDirDefault = "./delayd-data"
	// PrefixDefault is the default ingress subject prefix (DELAYD_PREFIX).
	PrefixDefault = contract.PrefixDefault
	// HTTPAddrDefault is the default health and metrics address (DELAYD_HTTP_ADDR): loopback, port 8223, next to
	// nats-server's own monitoring port 8222.
	HTTPAddrDefault = "127.0.0.1:8223"
	// IngressPartitionsDefault is DELAYD_INGRESS_PARTITIONS's default: ingress is not partitioned, one router.
	IngressPartitionsDefault = 1
	// ReplicasDefault is the default replica count of the streams and buckets delayd creates (DELAYD_REPLICAS).
	ReplicasDefault = 1
	// LogFormatDefault is the default log format (DELAYD_LOG_FORMAT).
	LogFormatDefault = "auto"
	// LogLevelDefault is the default log level (DELAYD_LOG_LEVEL).
	LogLevelDefault = "info"
	// StartGraceDefault is the default start-up grace for overdue deliveries to core subjects (DELAYD_START_GRACE).
	StartGraceDefault = 3 * time.Second
	// MaxDelayDefault is the default longest Delay-Duration or Delay-Deliver-At (DELAYD_MAX_DELAY): a week.
	MaxDelayDefault = contract.MaxDelayDefault
	// CancelShareDefault is DELAYD_CANCEL_SHARE's default: a tenth of one core for the cancel API's index lookups.
	CancelShareDefault = contract.CancelShareDefault
	// LeaseTTLDefault is the default TTL of the leases through which one delayd process at a time owns the router and
	// each level stream (DELAYD_LEASE_TTL): lease.TTLDefault, 1.5 s.
	LeaseTTLDefault = lease.TTLDefault
)

// Limits of DELAYD_LEASE_TTL: renewals run every TTL/3, so a shorter TTL costs more lease writes and leaves less room
// for a slow write; a longer one makes a crashed owner's work wait longer for another process.
const (
	LeaseTTLMin = 250 * time.Millisecond
	LeaseTTLMax = time.Minute
)

// Limits of DELAYD_REPLICAS: JetStream allows 1 to 5 replicas.
const (
	ReplicasMin = 1
	ReplicasMax = 5
)

// Config is delayd's configuration. [Load] fills it from the environment; the envconfig tags name each variable in
// full, and a variable that is not set keeps its default, the *Default constant (see [Load]).
type Config struct {
	// NATSURL lists the external NATS server(s) to connect to, comma-separated, as nats.Connect accepts them: URLs with
	// scheme nats, tls, ws or wss, or bare host[:port]. Spaces around entries are ignored.
	// Optional. Default "": start an embedded nats-server with JetStream.
	NATSURL string `envconfig:"DELAYD_NATS_URL"`

	// Listen is the embedded server's client listen address, host:port with port 1 to 65535. Unused with NATSURL.
	// Optional. Default [ListenDefault].
	Listen string `envconfig:"DELAYD_LISTEN"`

	// StoreDir is the embedded server's JetStream store directory. Unused with NATSURL.
	// Optional. Default [StoreDirDefault].
	StoreDir string `envconfig:"DELAYD_STORE_DIR"`

	// Levels is the level table, parsed by [levels.Parse]: durations separated by spaces, strictly increasing, units
	// ms s m h d.
	// Optional. Default [levels.DefaultTable], RocketMQ 4's 18 levels.
	Levels levels.Table `envconfig:"DELAYD_LEVELS"`

	// Partitions splits hot levels into partition streams, parsed by [levels.ParsePartitions]: entries
	// <level delay>=<count> separated by spaces or commas, e.g. "1m=4 5m=2"; each delay a level of Levels, each
	// count 1 to [levels.PartitionsMax] (1: not partitioned), no level twice. Level 1m with count 4 is the streams
	// DELAYD_1M-P0 to DELAYD_1M-P3. Every live replica must have the same list.
	// Optional. Default "": no level partitioned.
	Partitions levels.Partitions `envconfig:"DELAYD_PARTITIONS"`

	// IngressPartitions is the number of ingress partitions N, 1 to [levels.PartitionsMax]: with N above 1,
	// DELAYD_INGRESS stores "<Prefix>.<target>" under "delayd.in.<i>.<target>", i a hash of the subject mod N, and
	// N routers each route one partition under their own lease. Every level then has a multiple of N partitions
	// (N where Partitions gives it none), and a count in Partitions that is not a multiple of N is an error. Every
	// live replica must have the same value.
	// Optional. Default [IngressPartitionsDefault].
	IngressPartitions int `envconfig:"DELAYD_INGRESS_PARTITIONS"`

	// Prefix is the ingress subject prefix: publishers write to <Prefix>.<target subject>. See [ValidatePrefix].
	// Optional. Default [PrefixDefault].
	Prefix string `envconfig:"DELAYD_PREFIX"`

	// HTTPAddr is the address of the health (/healthz, /readyz) and metrics (/metrics) endpoints, host:port; port 0
	// picks a free port. "" disables them.
	// Optional. Default [HTTPAddrDefault].
	HTTPAddr string `envconfig:"DELAYD_HTTP_ADDR"`

	// Replicas is the replica count of every stream and bucket delayd creates, [ReplicasMin] to [ReplicasMax].
	// Optional. Default [ReplicasDefault].
	Replicas int `envconfig:"DELAYD_REPLICAS"`

	// LogFormat is "text" (tint), "json", or "auto" (text on a terminal, JSON otherwise); case-insensitive.
	// Optional. Default [LogFormatDefault].
	LogFormat string `envconfig:"DELAYD_LOG_FORMAT"`

	// LogLevel is "debug", "info", "warn" or "error"; case-insensitive. See [Config.SlogLevel].
	// Optional. Default [LogLevelDefault].
	LogLevel string `envconfig:"DELAYD_LOG_LEVEL"`

	// StartGrace is how long overdue deliveries to core subjects wait after start-up in embedded mode, so that
	// reconnecting subscribers get them. It is a Go duration (time.ParseDuration), >= 0.
	// Optional. Default [StartGraceDefault].
	StartGrace time.Duration `envconfig:"DELAYD_START_GRACE"`

	// MaxDelay is the longest delay a Delay-Duration, or a Delay-Deliver-At ahead of the ingress store time, may ask
	// for; longer is invalid input (dead-lettered). A Go duration (time.ParseDuration), > 0.
	// Optional. Default [MaxDelayDefault].
	MaxDelay time.Duration `envconfig:"DELAYD_MAX_DELAY"`

	// CancelShare is the share of one core's time, in (0, 1], the cancel API's id-index lookups may take
	// ([deliver.Config].CancelLookupShare); requests beyond it are answered busy (429). A decimal number.
	// Optional. Default [CancelShareDefault].
	CancelShare float64 `envconfig:"DELAYD_CANCEL_SHARE"`
	// LeaseTTL is the TTL, T, of the leases (bucket DELAYD_LEASES) through which one delayd process at a time owns the
	// router and each level stream: a process that stops renewing them (a crash, a kill -9) is replaced T after its
	// last renewal, so a process started after a crash waits T (from its first read of each lease) before routing
	// and delivering again; a graceful stop hands them over at once. A Go duration, [LeaseTTLMin] to [LeaseTTLMax].
	// Optional. Default [LeaseTTLDefault].
	LeaseTTL time.Duration `envconfig:"DELAYD_LEASE_TTL"`

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

	// AllowTargets lists the target subject patterns delayd may deliver to ([contract.ValidatePattern]: NATS
	// wildcards '*' and '>' as whole tokens), separated by spaces or commas. A target matching none is dead-lettered
	// with reason target. The list narrows what the contract allows; it never widens it.
	// Optional. Default empty: every valid target.
	AllowTargets Patterns `envconfig:"DELAYD_ALLOW_TARGETS"`

	// DenyTargets lists target subject patterns delayd must not deliver to, like AllowTargets. Deny wins over allow.
	// Optional. Default empty: none denied.
	DenyTargets Patterns `envconfig:"DELAYD_DENY_TARGETS"`
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

// Patterns is a list of NATS subject patterns, read from one variable with the patterns separated by spaces or
// commas (empty entries are skipped).
type Patterns []string

// Decode splits value on spaces and commas; it implements envconfig.Decoder.
func (p *Patterns) Decode(value string) error {
	*p = strings.FieldsFunc(value, func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
	if len(*p) == 0 {
		*p = nil
	}
	return nil
}

// String returns the patterns separated by spaces.
func (p Patterns) String() string { return strings.Join(p, " ") }

// TargetPolicy returns AllowTargets and DenyTargets as the [contract.TargetPolicy] for [deliver.Config].Targets.
func (c Config) TargetPolicy() contract.TargetPolicy {
	return contract.TargetPolicy{Allow: c.AllowTargets, Deny: c.DenyTargets}
}

// Load reads the configuration from the environment and validates it with [Config.Validate]. Unset variables take
// their defaults; a variable set to "" is "" (which only DELAYD_NATS_URL and DELAYD_HTTP_ADDR allow).
//
// Every variable is looked up by its full DELAYD_* name only. (envconfig.Process with prefix "DELAYD" would fall back
// to the unprefixed name, so a NATS_URL or LOG_LEVEL meant for another program would silently configure delayd.)
func Load() (Config, error) {
	c := defaults()
	if err := envconfig.Process("", &c); err != nil {
		var pe *envconfig.ParseError
		if errors.As(err, &pe) {
			return Config{}, &VarError{Var: pe.KeyName, Value: pe.Value, Reason: parseReason(pe), Err: pe.Err}
		}
		return Config{}, fmt.Errorf("config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// defaults returns the configuration of an empty environment: every optional variable at its *Default constant.
// [Load] lets envconfig overwrite only the variables that are set (envconfig leaves a field without a default tag
// untouched when its variable is unset), so each default is written once, here, from its constant.
func defaults() Config {
	return Config{
		Listen:   ListenDefault,
		StoreDir: StoreDirDefault,
		Levels:   levels.Default(),
		Prefix:   PrefixDefault,
		HTTPAddr: HTTPAddrDefault,
		Replicas: ReplicasDefault,

		IngressPartitions: IngressPartitionsDefault,
		LogFormat:         LogFormatDefault,
		LogLevel:          LogLevelDefault,
		StartGrace:        StartGraceDefault,
		MaxDelay:          MaxDelayDefault,

		CancelShare: CancelShareDefault,
		LeaseTTL:    LeaseTTLDefault,
	}
}

// parseReason says what is allowed for a variable envconfig could not convert.
func parseReason(pe *envconfig.ParseError) string {
	switch pe.KeyName {
	case "DELAYD_LEVELS":
		// The levels error names the offending token and what is wrong with it.
		return pe.Err.Error()
	case "DELAYD_PARTITIONS":
		// The partitions error names the offending entry and what is wrong with it.
		return pe.Err.Error()
	case "DELAYD_REPLICAS":
		return fmt.Sprintf("must be an integer between %d and %d", ReplicasMin, ReplicasMax)
	case "DELAYD_INGRESS_PARTITIONS":
		return fmt.Sprintf("must be an integer between 1 and %d", levels.PartitionsMax)
	case "DELAYD_START_GRACE":
		return `must be a Go duration >= 0, such as "3s" or "500ms"`
	case "DELAYD_MAX_DELAY":
		return `must be a positive Go duration, such as "168h"`
	case "DELAYD_CANCEL_SHARE":
		return "must be a number above 0 and at most 1, such as 0.1"
	case "DELAYD_LEASE_TTL":
		return fmt.Sprintf(`must be a Go duration from %s to %s, such as "1500ms"`, LeaseTTLMin, LeaseTTLMax)
	}
	return pe.Err.Error()
}

// VarError is a bad value of one environment variable. It wraps [ErrInvalid], and the underlying error if any.
type VarError struct {
	Var    string // the variable, e.g. "DELAYD_REPLICAS"
	Value  string // the bad value: a URL password or token is "xxxxx", a password or token variable "<redacted>"
	Reason string // what is wrong, and what is allowed
	Err    error  // the underlying error, or nil
}

// Error returns `VAR="value": reason`.
func (e *VarError) Error() string { return fmt.Sprintf("%s=%q: %s", e.Var, e.Value, e.Reason) }

// Unwrap returns [ErrInvalid] and the underlying error.
func (e *VarError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrInvalid}
	}
	return []error{ErrInvalid, e.Err}
}

// Validate checks every field and returns nil or the errors joined, each a [*VarError] naming the variable, the bad
// value and what is allowed, e.g. `DELAYD_REPLICAS="9": must be between 1 and 5`.
func (c Config) Validate() error {
	var errs []error
	bad := func(name, value, reason string, err error) {
		errs = append(errs, &VarError{Var: name, Value: value, Reason: reason, Err: err})
	}

	if err := validateNATSURL(c.NATSURL); err != nil {
		bad("DELAYD_NATS_URL", RedactURLs(c.NATSURL), err.Error(), nil)
	}
	if reason := checkHostPort(c.Listen, 1); reason != "" {
		bad("DELAYD_LISTEN", c.Listen, reason, nil)
	}
	if c.StoreDir == "" {
		bad("DELAYD_STORE_DIR", c.StoreDir, "must not be empty", nil)
	}
	if c.Levels.Len() == 0 {
		bad("DELAYD_LEVELS", c.Levels.String(), "must hold at least one level", levels.ErrEmptyTable)
	}
	if c.IngressPartitions < 1 || c.IngressPartitions > levels.PartitionsMax {
		bad("DELAYD_INGRESS_PARTITIONS", strconv.Itoa(c.IngressPartitions), fmt.Sprintf("must be between 1 and %d", levels.PartitionsMax), nil)
	} else if err := c.Partitions.WithIngress(c.IngressPartitions).Check(c.Levels); err != nil && c.Levels.Len() > 0 {
		reason := err.Error()
		if c.IngressPartitions > 1 {
			reason = fmt.Sprintf("%s (DELAYD_INGRESS_PARTITIONS=%d: each level's count must be a multiple of it)", reason, c.IngressPartitions)
		}
		bad("DELAYD_PARTITIONS", c.Partitions.String(), reason, err)
	}
	if reason := prefixReason(c.Prefix); reason != "" {
		bad("DELAYD_PREFIX", c.Prefix, reason, nil)
	}
	if c.HTTPAddr != "" {
		if reason := checkHostPort(c.HTTPAddr, 0); reason != "" {
			bad("DELAYD_HTTP_ADDR", c.HTTPAddr, reason+`, or "" to disable`, nil)
		}
	}
	if c.Replicas < ReplicasMin || c.Replicas > ReplicasMax {
		bad("DELAYD_REPLICAS", strconv.Itoa(c.Replicas),
			fmt.Sprintf("must be between %d and %d", ReplicasMin, ReplicasMax), nil)
	}
	switch strings.ToLower(c.LogFormat) {
	case "text", "json", "auto":
	default:
		bad("DELAYD_LOG_FORMAT", c.LogFormat, "must be text, json or auto", nil)
	}
	if _, ok := parseLogLevel(c.LogLevel); !ok {
		bad("DELAYD_LOG_LEVEL", c.LogLevel, "must be debug, info, warn or error", nil)
	}
	if c.MaxDelay <= 0 {
		bad("DELAYD_MAX_DELAY", c.MaxDelay.String(), "must be a positive Go duration, such as 168h", nil)
	}
	if !(c.CancelShare > 0 && c.CancelShare <= 1) {
		bad("DELAYD_CANCEL_SHARE", strconv.FormatFloat(c.CancelShare, 'g', -1, 64), "must be a number above 0 and at most 1, such as 0.1", nil)
	}
	if c.StartGrace < 0 {
		bad("DELAYD_START_GRACE", c.StartGrace.String(), "must be >= 0", nil)
	}
	if c.LeaseTTL < LeaseTTLMin || c.LeaseTTL > LeaseTTLMax {
		bad("DELAYD_LEASE_TTL", c.LeaseTTL.String(), fmt.Sprintf("must be a Go duration from %s to %s", LeaseTTLMin, LeaseTTLMax), nil)
	}
	errs = append(errs, c.validateSecurity()...)
	for _, v := range []struct {
		name string
		list Patterns
	}{{"DELAYD_ALLOW_TARGETS", c.AllowTargets}, {"DELAYD_DENY_TARGETS", c.DenyTargets}} {
		for _, p := range v.list {
			if err := contract.ValidatePattern(p); err != nil {
				bad(v.name, v.list.String(), err.Error()+
					" (want NATS subject patterns separated by spaces or commas, wildcards '*' and '>' as whole tokens, '>' last)", nil)
				break
			}
		}
	}
	return errors.Join(errs...)
}

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

// SlogLevel returns LogLevel as a [slog.Level]. Call it after [Config.Validate]; an invalid LogLevel is
// [slog.LevelInfo].
func (c Config) SlogLevel() slog.Level {
	lvl, _ := parseLogLevel(c.LogLevel)
	return lvl
}

func parseLogLevel(s string) (slog.Level, bool) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, true
	case "info":
		return slog.LevelInfo, true
	case "warn":
		return slog.LevelWarn, true
	case "error":
		return slog.LevelError, true
	}
	return slog.LevelInfo, false
}

// checkHostPort returns why addr is not host:port with port minPort to 65535, or "". The host may be empty (all
// interfaces).
func checkHostPort(addr string, minPort int) string {
	want := fmt.Sprintf("must be host:port with port %d to 65535", minPort)
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return want
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < minPort || n > 65535 || port[0] == '+' || port[0] == '-' {
		return want
	}
	return ""
}

// natsSchemes are the URL schemes nats.go accepts.
var natsSchemes = map[string]bool{"nats": true, "tls": true, "ws": true, "wss": true}

// validateNATSURL checks a comma-separated server list as nats.Connect reads it: entries trimmed, empty entries
// skipped, each a URL with scheme nats, tls, ws or wss or a bare host[:port], websocket and non-websocket not mixed.
func validateNATSURL(list string) error {
	if list == "" {
		return nil
	}
	var n, ws int
	for entry := range strings.SplitSeq(list, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		n++
		raw := entry
		if !strings.Contains(entry, "://") {
			raw = "nats://" + entry
		}
		u, err := url.Parse(raw)
		if err != nil || !natsSchemes[u.Scheme] || u.Hostname() == "" || strings.ContainsAny(u.Host, " \t") {
			return fmt.Errorf("%q is not a server URL (want nats://, tls://, ws:// or wss://host:port, or host:port, comma-separated)",
				RedactURLs(entry))
		}
		if p := u.Port(); p != "" {
			if port, err := strconv.Atoi(p); err != nil || port < 1 || port > 65535 {
				return fmt.Errorf("%q has a bad port (want 1 to 65535)", RedactURLs(entry))
			}
		}
		if u.Scheme == "ws" || u.Scheme == "wss" {
			ws++
		}
	}
	if n == 0 {
		return errors.New(`holds no server URL (want nats://host:port, comma-separated, or "" for the embedded server)`)
	}
	if ws != 0 && ws != n {
		return errors.New("mixes websocket (ws, wss) and non-websocket URLs, which nats.go rejects")
	}
	return nil
}

// RedactURLs returns a comma-separated list of server URLs with every secret replaced by "xxxxx": the password of
// user:password@, and a token@ (a user name without a password, which nats.go sends as a token). nats.go's own
// ConnectedUrlRedacted keeps a token; pass its result through RedactURLs before logging it.
func RedactURLs(list string) string {
	entries := strings.Split(list, ",")
	for i, entry := range entries {
		if u, err := url.Parse(strings.TrimSpace(entry)); err == nil && u.User != nil {
			if _, ok := u.User.Password(); ok {
				u.User = url.UserPassword(u.User.Username(), "xxxxx")
			} else {
				u.User = url.User("xxxxx")
			}
			entries[i] = u.String()
		}
	}
	return strings.Join(entries, ",")
}

// ValidatePrefix checks an ingress subject prefix. It must be a valid literal NATS subject: non-empty tokens separated
// by '.', with no wildcard '*' or '>', no whitespace, no control characters, and valid UTF-8. It must not overlap
// delayd's internal subjects ("delayd" and "delayd.…"), the system and JetStream API subjects (anything starting with
// '$'), or request-reply inboxes ("_INBOX" and "_INBOX.…"). Errors wrap [ErrInvalid].
func ValidatePrefix(p string) error {
	if reason := prefixReason(p); reason != "" {
		return fmt.Errorf("config: prefix %q: %s: %w", p, reason, ErrInvalid)
	}
	return nil
}

// prefixReason returns why p is not a valid ingress prefix (see [ValidatePrefix]), or "".
func prefixReason(p string) string {
	switch {
	case p == "":
		return "must not be empty"
	case !utf8.ValidString(p):
		return "must be valid UTF-8"
	case strings.IndexFunc(p, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return "must not contain whitespace or control characters"
	case strings.ContainsAny(p, "*>"):
		return "must be a literal subject, without wildcards '*' or '>'"
	case strings.HasPrefix(p, "$"):
		return "must not start with '$' (system and JetStream API subjects)"
	}
	for tok := range strings.SplitSeq(p, ".") {
		if tok == "" {
			return `must not have empty tokens (want tokens separated by single dots, e.g. "sched.in")`
		}
	}
	for _, reserved := range []string{"delayd", "_INBOX"} {
		if p == reserved || strings.HasPrefix(p, reserved+".") {
			return fmt.Sprintf("must not be %s or start with %s. (reserved subjects)", reserved, reserved)
		}
	}
	return ""
}

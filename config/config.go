// Package config reads delayd's configuration from the environment (variables DELAYD_*, read with
// github.com/kelseyhightower/envconfig) and validates it. It is the only package that reads the environment.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/kelseyhightower/envconfig"

	"github.com/delayd/delayd/levels"
)

// Defaults of the optional variables.
const (
	// ListenDefault is the default embedded-server client listen address (DELAYD_LISTEN).
	ListenDefault = "127.0.0.1:4222"
	// StoreDirDefault is the default embedded-server JetStream store directory (DELAYD_STORE_DIR).
	StoreDirDefault = "./delayd-data"
	// PrefixDefault is the default ingress subject prefix (DELAYD_PREFIX).
	PrefixDefault = "delay"
	// HTTPAddrDefault is the default health and metrics address (DELAYD_HTTP_ADDR): loopback, port 8223, next to
	// nats-server's own monitoring port 8222.
	HTTPAddrDefault = "127.0.0.1:8223"
	// ReplicasDefault is the default replica count of the streams and buckets delayd creates (DELAYD_REPLICAS).
	ReplicasDefault = 1
	// LogFormatDefault is the default log format (DELAYD_LOG_FORMAT).
	LogFormatDefault = "auto"
	// LogLevelDefault is the default log level (DELAYD_LOG_LEVEL).
	LogLevelDefault = "info"
	// StartGraceDefault is the default start-up grace for overdue deliveries to core subjects (DELAYD_START_GRACE).
	StartGraceDefault = 3 * time.Second
)

// Limits of DELAYD_REPLICAS: JetStream allows 1 to 5 replicas.
const (
	ReplicasMin = 1
	ReplicasMax = 5
)

// ErrInvalid is wrapped by every error from [Load] and [Config.Validate] about a bad value.
var ErrInvalid = errors.New("invalid configuration")

// Config is delayd's configuration. [Load] fills it from the environment; the envconfig tags name each variable in
// full, and the default tags hold the defaults of the *Default constants.
type Config struct {
	// NATSURL lists the external NATS server(s) to connect to, comma-separated, as nats.Connect accepts them: URLs with
	// scheme nats, tls, ws or wss, or bare host[:port]. Spaces around entries are ignored.
	// Optional. Default "": start an embedded nats-server with JetStream.
	NATSURL string `envconfig:"DELAYD_NATS_URL"`

	// Listen is the embedded server's client listen address, host:port with port 1 to 65535. Unused with NATSURL.
	// Optional. Default [ListenDefault].
	Listen string `envconfig:"DELAYD_LISTEN" default:"127.0.0.1:4222"`

	// StoreDir is the embedded server's JetStream store directory. Unused with NATSURL.
	// Optional. Default [StoreDirDefault].
	StoreDir string `envconfig:"DELAYD_STORE_DIR" default:"./delayd-data"`

	// Levels is the level table, parsed by [levels.Parse]: durations separated by spaces, strictly increasing, units
	// ms s m h d.
	// Optional. Default [levels.DefaultTable], RocketMQ 4's 18 levels.
	Levels levels.Table `envconfig:"DELAYD_LEVELS" default:"1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"`

	// Prefix is the ingress subject prefix: publishers write to <Prefix>.<target subject>. See [ValidatePrefix].
	// Optional. Default [PrefixDefault].
	Prefix string `envconfig:"DELAYD_PREFIX" default:"delay"`

	// HTTPAddr is the address of the health (/healthz, /readyz) and metrics (/metrics) endpoints, host:port; port 0
	// picks a free port. "" disables them.
	// Optional. Default [HTTPAddrDefault].
	HTTPAddr string `envconfig:"DELAYD_HTTP_ADDR" default:"127.0.0.1:8223"`

	// Replicas is the replica count of every stream and bucket delayd creates, [ReplicasMin] to [ReplicasMax].
	// Optional. Default [ReplicasDefault].
	Replicas int `envconfig:"DELAYD_REPLICAS" default:"1"`

	// LogFormat is "text" (tint), "json", or "auto" (text on a terminal, JSON otherwise); case-insensitive.
	// Optional. Default [LogFormatDefault].
	LogFormat string `envconfig:"DELAYD_LOG_FORMAT" default:"auto"`

	// LogLevel is "debug", "info", "warn" or "error"; case-insensitive. See [Config.SlogLevel].
	// Optional. Default [LogLevelDefault].
	LogLevel string `envconfig:"DELAYD_LOG_LEVEL" default:"info"`

	// StartGrace is how long overdue deliveries to core subjects wait after start-up in embedded mode, so that
	// reconnecting subscribers get them. It is a Go duration (time.ParseDuration), >= 0.
	// Optional. Default [StartGraceDefault].
	StartGrace time.Duration `envconfig:"DELAYD_START_GRACE" default:"3s"`
}

// Load reads the configuration from the environment and validates it with [Config.Validate]. Unset variables take
// their defaults; a variable set to "" is "" (which only DELAYD_NATS_URL and DELAYD_HTTP_ADDR allow).
//
// Every variable is looked up by its full DELAYD_* name only. (envconfig.Process with prefix "DELAYD" would fall back
// to the unprefixed name, so a NATS_URL or LOG_LEVEL meant for another program would silently configure delayd.)
func Load() (Config, error) {
	var c Config
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

// parseReason says what is allowed for a variable envconfig could not convert.
func parseReason(pe *envconfig.ParseError) string {
	switch pe.KeyName {
	case "DELAYD_LEVELS":
		// The levels error names the offending token and what is wrong with it.
		return pe.Err.Error()
	case "DELAYD_REPLICAS":
		return fmt.Sprintf("must be an integer between %d and %d", ReplicasMin, ReplicasMax)
	case "DELAYD_START_GRACE":
		return `must be a Go duration >= 0, such as "3s" or "500ms"`
	}
	return pe.Err.Error()
}

// VarError is a bad value of one environment variable. It wraps [ErrInvalid], and the underlying error if any.
type VarError struct {
	Var    string // the variable, e.g. "DELAYD_REPLICAS"
	Value  string // the bad value, with any URL password redacted
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
		bad("DELAYD_NATS_URL", redactURLs(c.NATSURL), err.Error(), nil)
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
	if c.StartGrace < 0 {
		bad("DELAYD_START_GRACE", c.StartGrace.String(), "must be >= 0", nil)
	}
	return errors.Join(errs...)
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
				redactURLs(entry))
		}
		if p := u.Port(); p != "" {
			if port, err := strconv.Atoi(p); err != nil || port < 1 || port > 65535 {
				return fmt.Errorf("%q has a bad port (want 1 to 65535)", redactURLs(entry))
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

// redactURLs replaces the password of each URL in a comma-separated list with "xxxxx".
func redactURLs(list string) string {
	entries := strings.Split(list, ",")
	for i, entry := range entries {
		if u, err := url.Parse(strings.TrimSpace(entry)); err == nil && u.User != nil {
			if _, ok := u.User.Password(); ok {
				entries[i] = u.Redacted()
			}
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

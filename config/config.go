// Package config reads delayd's configuration from the environment (variables DELAYD_*, read with
// github.com/kelseyhightower/envconfig) and validates it. It is the only package that reads the environment.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/kelseyhightower/envconfig"

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
	// PrecisionDefault is DELAYD_PRECISION's default: the precision levels are created.
	PrecisionDefault = "on"
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
	// AnswerKeepDefault is DELAYD_ANSWER_KEEP's default: how long a message's final answer is kept for cancel and
	// status once the id index forgot it, 6 hours.
	AnswerKeepDefault = contract.AnswerKeepDefault
	// AnswerMaxBytesDefault is DELAYD_ANSWER_MAX_BYTES's default: 256 MiB, about 2.3 million answers (docs/guarantees.md#what-kept-answers-cost).
	AnswerMaxBytesDefault = contract.AnswerMaxBytesDefault
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

	// Precision is "on" or "off" (case-insensitive): whether delayd creates the precision levels, the streams below
	// the shortest level through which a Delay-Duration or Delay-Deliver-At message's last stretch passes
	// (1 ms, 2 ms, ... 512 ms below the default 1 s level: 10 streams, 10 Raft groups with DELAYD_REPLICAS above 1).
	// With "off", [Load] returns Levels without them ([levels.Table.WithoutPrecision]): such a message's last
	// stretch waits in the shortest level, and is delivered never early and late by less than the shortest level's
	// delay, instead of by milliseconds. Delay-Level messages are unaffected. Every live replica must have the same
	// value.
	// Optional. Default [PrecisionDefault].
	Precision string `envconfig:"DELAYD_PRECISION"`

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

	// HTTP holds DELAYD_HTTP_ADDR and DELAYD_CONSOLE_TOKEN; its fields are promoted, like NATSAuth's.
	HTTP

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
	// AnswerKeep is how long a message's final answer ("already delivered", "cancelled") is kept for the cancel and
	// status APIs once the id index has trimmed its records (about a minute after it left its level); after it the
	// answer is "not found" ([deliver.Config].AnswerKeep). A Go duration, 1s to 720h; 0 or "off" turns kept
	// answers off (one JetStream write and one read fewer per message, "not found" about a minute after a message
	// left its level). Optional. Default [AnswerKeepDefault].
	AnswerKeep OffDuration `envconfig:"DELAYD_ANSWER_KEEP"`
	// AnswerMaxBytes bounds the kept answers (stream DELAYD_ANSWERS) on disk; past it the oldest go first. Bytes, as
	// a whole number with an optional unit (KiB, MiB, GiB), at least 1MiB. Optional. Default [AnswerMaxBytesDefault].
	AnswerMaxBytes ByteSize `envconfig:"DELAYD_ANSWER_MAX_BYTES"`

	// NATSAuth holds the authentication and TLS variables of the connection to NATSURL's servers; its fields are
	// promoted (c.NATSUser) and keep their full variable names (envconfig gives an embedded struct's fields no prefix).
	NATSAuth

	// TargetLists holds DELAYD_ALLOW_TARGETS and DELAYD_DENY_TARGETS; its fields are promoted, like NATSAuth's.
	TargetLists
}

// HTTP is the HTTP endpoints' configuration of [Config]: health, metrics and the console.
type HTTP struct {
	// HTTPAddr is the address of the health (/healthz, /readyz), metrics (/metrics) and console (/console/)
	// endpoints, host:port; port 0 picks a free port. "" disables them.
	// Optional. Default [HTTPAddrDefault].
	HTTPAddr string `envconfig:"DELAYD_HTTP_ADDR"`

	// ConsoleToken is the token the console's actions (cancel, reschedule, run now) need, sent as
	// "Authorization: Bearer <token>" or through the console's login form (a cookie). When set, every action needs
	// it, whatever the listener; when empty, actions are allowed only from a loopback-only HTTPAddr. At least
	// [ConsoleTokenMin] characters, printable ASCII without spaces (docs/operations.md#the-console).
	// Optional. Default "": no token.
	ConsoleToken Secret `envconfig:"DELAYD_CONSOLE_TOKEN"`
}

// ConsoleTokenMin is the shortest DELAYD_CONSOLE_TOKEN, in characters (bytes of printable ASCII).
const ConsoleTokenMin = 16

// consoleTokenReason returns why t is not a valid DELAYD_CONSOLE_TOKEN, or "".
func consoleTokenReason(t string) string {
	if t == "" {
		return ""
	}
	for i := 0; i < len(t); i++ {
		if t[i] < 0x21 || t[i] > 0x7e {
			return "must be printable ASCII without spaces (it is sent in an Authorization header and a cookie)"
		}
	}
	if len(t) < ConsoleTokenMin {
		return fmt.Sprintf("must be at least %d characters", ConsoleTokenMin)
	}
	return ""
}

// TargetLists are the target subject pattern lists of [Config], see [Config.TargetPolicy].
type TargetLists struct {
	// AllowTargets lists the target subject patterns delayd may deliver to ([contract.ValidatePattern]: NATS
	// wildcards '*' and '>' as whole tokens), separated by spaces or commas. A target matching none is dead-lettered
	// with reason target. The list narrows what the contract allows; it never widens it.
	// Optional. Default empty: every valid target.
	AllowTargets Patterns `envconfig:"DELAYD_ALLOW_TARGETS"`

	// DenyTargets lists target subject patterns delayd must not deliver to, like AllowTargets. Deny wins over allow.
	// Optional. Default empty: none denied.
	DenyTargets Patterns `envconfig:"DELAYD_DENY_TARGETS"`
}

// OffDuration is a Go duration whose 0 means off; "off" also decodes to 0.
type OffDuration time.Duration

// Decode parses value (envconfig.Decoder): "off" or a Go duration.
func (d *OffDuration) Decode(value string) error {
	v := strings.TrimSpace(value)
	if v == "off" {
		*d = 0
		return nil
	}
	p, err := time.ParseDuration(v)
	if err != nil {
		return err
	}
	*d = OffDuration(p)
	return nil
}

// String is "off" for 0, else the Go duration.
func (d OffDuration) String() string {
	if d == 0 {
		return "off"
	}
	return time.Duration(d).String()
}

// ByteSize is a number of bytes: a whole number with an optional unit, KiB, MiB or GiB (powers of 1024), e.g.
// "4GiB" or "1048576".
type ByteSize int64

// Decode parses value (envconfig.Decoder).
func (b *ByteSize) Decode(value string) error {
	v := strings.TrimSpace(value)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if rest, ok := strings.CutSuffix(v, u.suffix); ok {
			v, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return fmt.Errorf("not a byte size: %q", value)
	}
	*b = ByteSize(n * mult)
	return nil
}

// String formats b with the largest unit that divides it exactly: "4GiB", "1536KiB", "1000".
func (b ByteSize) String() string {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b != 0 && int64(b)%u.mult == 0 {
			return strconv.FormatInt(int64(b)/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10)
}

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
	if !precisionOn(c.Precision) {
		c.Levels = c.Levels.WithoutPrecision()
	}
	return c, nil
}

// precisionOn reports whether a valid DELAYD_PRECISION value asks for the precision levels.
func precisionOn(v string) bool { return !strings.EqualFold(v, "off") }

// precisionReason returns why v is not a valid DELAYD_PRECISION value, or "".
func precisionReason(v string) string {
	switch strings.ToLower(v) {
	case "on", "off":
		return ""
	}
	return "must be on (precision levels below the shortest level: any delay late by milliseconds) or off (none: " +
		"a Delay-Duration or Delay-Deliver-At message late by less than the shortest level's delay)"
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

		Precision: PrecisionDefault,
		HTTP:      HTTP{HTTPAddr: HTTPAddrDefault},
		Replicas:  ReplicasDefault,

		IngressPartitions: IngressPartitionsDefault,
		LogFormat:         LogFormatDefault,
		LogLevel:          LogLevelDefault,
		StartGrace:        StartGraceDefault,
		MaxDelay:          MaxDelayDefault,

		CancelShare: CancelShareDefault,
		LeaseTTL:    LeaseTTLDefault,

		AnswerKeep:     OffDuration(AnswerKeepDefault),
		AnswerMaxBytes: AnswerMaxBytesDefault,
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
	case "DELAYD_ANSWER_KEEP":
		return `must be a Go duration from 1s to 720h, such as "6h", or 0 or "off"`
	case "DELAYD_ANSWER_MAX_BYTES":
		return `must be a whole number of bytes, at least 1MiB, with an optional unit KiB, MiB or GiB, such as "1GiB"`
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
	if reason := precisionReason(c.Precision); reason != "" {
		bad("DELAYD_PRECISION", c.Precision, reason, nil)
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
	if reason := consoleTokenReason(string(c.ConsoleToken)); reason != "" {
		bad("DELAYD_CONSOLE_TOKEN", c.ConsoleToken.String(), reason, nil)
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
	if keep := time.Duration(c.AnswerKeep); keep != 0 && (keep < contract.AnswerKeepMin || keep > contract.AnswerKeepMax) {
		bad("DELAYD_ANSWER_KEEP", c.AnswerKeep.String(), "must be a Go duration from 1s to 720h, such as 6h, or 0 or off", nil)
	}
	if c.AnswerMaxBytes < contract.AnswerMaxBytesMin {
		bad("DELAYD_ANSWER_MAX_BYTES", c.AnswerMaxBytes.String(), "must be at least 1MiB (1048576 bytes)", nil)
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

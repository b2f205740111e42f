package config

import (
	"errors"
	"log/slog"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/levels"
)

// vars are every variable Config reads.
var vars = []string{
	"DELAYD_NATS_URL", "DELAYD_LISTEN", "DELAYD_STORE_DIR", "DELAYD_LEVELS", "DELAYD_PREFIX", "DELAYD_HTTP_ADDR",
	"DELAYD_REPLICAS", "DELAYD_LOG_FORMAT", "DELAYD_LOG_LEVEL", "DELAYD_START_GRACE", "DELAYD_MAX_DELAY", "DELAYD_CANCEL_SHARE", "DELAYD_LEASE_TTL",
	"DELAYD_NATS_USER", "DELAYD_NATS_PASSWORD", "DELAYD_NATS_TOKEN", "DELAYD_NATS_NKEY_SEED", "DELAYD_NATS_CREDS",
	"DELAYD_NATS_TLS_CA", "DELAYD_NATS_TLS_CERT", "DELAYD_NATS_TLS_KEY", "DELAYD_ALLOW_TARGETS", "DELAYD_DENY_TARGETS",
	"DELAYD_PARTITIONS", "DELAYD_INGRESS_PARTITIONS", "DELAYD_PRECISION", "DELAYD_ANSWER_KEEP", "DELAYD_ANSWER_MAX_BYTES",
	"DELAYD_CONSOLE_TOKEN",
}

// clearEnv unsets every DELAYD_* variable (and the unprefixed names envconfig could fall back to) for the test.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, name := range vars {
		for _, n := range []string{name, strings.TrimPrefix(name, "DELAYD_")} {
			t.Setenv(n, "") // restores the old value after the test
			if err := os.Unsetenv(n); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestLoadDefaults(t *testing.T) {
	clearEnv(t)

	c, err := Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := Config{
		Listen:    ListenDefault,
		StoreDir:  StoreDirDefault,
		Levels:    levels.Default(),
		Precision: PrecisionDefault,
		Prefix:    PrefixDefault,
		HTTP:      HTTP{HTTPAddr: HTTPAddrDefault},
		Replicas:  ReplicasDefault,
		LogFormat: LogFormatDefault,

		IngressPartitions: IngressPartitionsDefault,
		LogLevel:          LogLevelDefault,
		StartGrace:        StartGraceDefault,
		MaxDelay:          MaxDelayDefault,
		CancelShare:       CancelShareDefault,
		LeaseTTL:          LeaseTTLDefault,
		AnswerKeep:        OffDuration(AnswerKeepDefault),
		AnswerMaxBytes:    AnswerMaxBytesDefault,
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Load() = %+v, want %+v", c, want)
	}
	if c.Levels.String() != levels.DefaultTable {
		t.Errorf("Levels = %q, want %q", c.Levels, levels.DefaultTable)
	}
	if c.SlogLevel() != slog.LevelInfo {
		t.Errorf("SlogLevel() = %v, want %v", c.SlogLevel(), slog.LevelInfo)
	}
}

// TestVarTags checks that every field names a known variable, that every variable is in vars, and that no field has
// an envconfig default tag: each default is written once, as its *Default constant, and [Load] starts from
// defaults() (TestLoadDefaults checks the values).
func TestVarTags(t *testing.T) {
	t.Parallel()

	known := map[string]bool{}
	for _, name := range []string{
		"DELAYD_NATS_URL", "DELAYD_LISTEN", "DELAYD_STORE_DIR", "DELAYD_LEVELS", "DELAYD_PREFIX", "DELAYD_HTTP_ADDR",
		"DELAYD_REPLICAS", "DELAYD_LOG_FORMAT", "DELAYD_LOG_LEVEL", "DELAYD_START_GRACE", "DELAYD_MAX_DELAY", "DELAYD_CANCEL_SHARE", "DELAYD_LEASE_TTL",
		"DELAYD_NATS_USER", "DELAYD_NATS_PASSWORD", "DELAYD_NATS_TOKEN", "DELAYD_NATS_NKEY_SEED",
		"DELAYD_NATS_CREDS", "DELAYD_NATS_TLS_CA", "DELAYD_NATS_TLS_CERT", "DELAYD_NATS_TLS_KEY",
		"DELAYD_ALLOW_TARGETS", "DELAYD_DENY_TARGETS", "DELAYD_PARTITIONS", "DELAYD_INGRESS_PARTITIONS", "DELAYD_PRECISION",
		"DELAYD_ANSWER_KEEP", "DELAYD_ANSWER_MAX_BYTES", "DELAYD_CONSOLE_TOKEN",
	} {
		known[name] = true
	}
	// The variables are Config's own fields and those promoted from its embedded structs (NATSAuth, TargetLists),
	// whose tags envconfig reads without a prefix; an embedded struct itself is no variable.
	var fields []reflect.StructField
	for _, f := range reflect.VisibleFields(reflect.TypeFor[Config]()) {
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			if tag, ok := f.Tag.Lookup("envconfig"); ok {
				t.Errorf("embedded %s: envconfig tag %q: envconfig ignores it, its fields name their variables", f.Name, tag)
			}
			continue
		}
		fields = append(fields, f)
	}
	if len(fields) != len(vars) {
		t.Fatalf("Config has %d fields, want %d", len(fields), len(vars))
	}
	for _, f := range fields {
		name := f.Tag.Get("envconfig")
		if !known[name] {
			t.Errorf("field %s: variable %q is not known to the test", f.Name, name)
		}
		if def, ok := f.Tag.Lookup("default"); ok {
			t.Errorf("field %s: default tag %q: defaults come from defaults(), not tags", f.Name, def)
		}
	}
}

// TestLoadSetEmpty checks that a variable set to "" is "", not its default: Load fills defaults only for unset
// variables.
func TestLoadSetEmpty(t *testing.T) {
	clearEnv(t)
	t.Setenv("DELAYD_HTTP_ADDR", "")
	c, err := Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if c.HTTPAddr != "" {
		t.Errorf("DELAYD_HTTP_ADDR set to \"\": HTTPAddr = %q, want \"\"", c.HTTPAddr)
	}
	t.Setenv("DELAYD_PREFIX", "")
	if _, err := Load(); err == nil || !strings.Contains(err.Error(), "DELAYD_PREFIX") {
		t.Errorf("DELAYD_PREFIX set to \"\": Load error = %v, want one naming DELAYD_PREFIX", err)
	}
}

func TestLoadIgnoresUnprefixed(t *testing.T) {
	clearEnv(t)
	t.Setenv("NATS_URL", "nats://elsewhere:4222") // the nats CLI's variable
	t.Setenv("LOG_LEVEL", "debug")
	t.Setenv("PREFIX", "/usr/local")
	t.Setenv("REPLICAS", "abc")

	c, err := Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if c.NATSURL != "" || c.LogLevel != LogLevelDefault || c.Prefix != PrefixDefault || c.Replicas != ReplicasDefault {
		t.Errorf("Load() read unprefixed variables: %+v", c)
	}
}

func TestLoadValues(t *testing.T) {
	clearEnv(t)
	t.Setenv("DELAYD_NATS_URL", " nats://a:4222, tls://b:4223 ,c:4224,d")
	t.Setenv("DELAYD_LISTEN", ":4333")
	t.Setenv("DELAYD_STORE_DIR", "/var/lib/delayd")
	t.Setenv("DELAYD_LEVELS", " 100ms\t90s 1d ")
	t.Setenv("DELAYD_PREFIX", "sched.in")
	t.Setenv("DELAYD_HTTP_ADDR", "")
	t.Setenv("DELAYD_REPLICAS", "3")
	t.Setenv("DELAYD_LOG_FORMAT", "JSON")
	t.Setenv("DELAYD_LOG_LEVEL", "Debug")
	t.Setenv("DELAYD_START_GRACE", "0s")
	t.Setenv("DELAYD_LEASE_TTL", "3s")
	t.Setenv("DELAYD_PARTITIONS", "90s=4, 1d=2")
	t.Setenv("DELAYD_ANSWER_KEEP", "24h")
	t.Setenv("DELAYD_ANSWER_MAX_BYTES", "512MiB")

	c, err := Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := Config{
		NATSURL:   " nats://a:4222, tls://b:4223 ,c:4224,d",
		Listen:    ":4333",
		StoreDir:  "/var/lib/delayd",
		Levels:    levels.MustParse("100ms 1m30s 24h"),
		Precision: PrecisionDefault,
		Prefix:    "sched.in",
		HTTP:      HTTP{HTTPAddr: ""},
		Replicas:  3,
		LogFormat: "JSON",

		IngressPartitions: IngressPartitionsDefault,
		LogLevel:          "Debug",
		StartGrace:        0,
		MaxDelay:          MaxDelayDefault,
		CancelShare:       CancelShareDefault,
		LeaseTTL:          3 * time.Second,
		AnswerKeep:        OffDuration(24 * time.Hour),
		AnswerMaxBytes:    512 << 20,
	}
	if got := c.Partitions.String(); got != "1m30s=4 24h=2" {
		t.Errorf("Partitions = %q, want %q", got, "1m30s=4 24h=2")
	}
	c.Partitions = levels.Partitions{}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Load() = %+v, want %+v", c, want)
	}
	if c.SlogLevel() != slog.LevelDebug {
		t.Errorf("SlogLevel() = %v, want %v", c.SlogLevel(), slog.LevelDebug)
	}
}

func TestLoadBadValue(t *testing.T) {
	tests := []struct {
		name  string
		value string
		want  string // substring of the error besides NAME="value"
		err   error  // a further sentinel the error wraps, if any
	}{
		{name: "DELAYD_NATS_URL", value: "http://a:4222", want: "not a server URL"},
		{name: "DELAYD_NATS_URL", value: "nats://:4222", want: "not a server URL"},
		{name: "DELAYD_NATS_URL", value: "nats://a:99999", want: "bad port"},
		{name: "DELAYD_NATS_URL", value: "nats://a b:4222", want: "not a server URL"},
		{name: "DELAYD_NATS_URL", value: " , ", want: "no server URL"},
		{name: "DELAYD_NATS_URL", value: "nats://a:4222,ws://b:8080", want: "mixes websocket"},
		{name: "DELAYD_LISTEN", value: "4222", want: "host:port"},
		{name: "DELAYD_LISTEN", value: "127.0.0.1:0", want: "port 1 to 65535"},
		{name: "DELAYD_LISTEN", value: "127.0.0.1:65536", want: "port 1 to 65535"},
		{name: "DELAYD_LISTEN", value: "127.0.0.1:http", want: "port 1 to 65535"},
		{name: "DELAYD_LISTEN", value: "", want: "host:port"},
		{name: "DELAYD_STORE_DIR", value: "", want: "must not be empty"},
		{name: "DELAYD_LEVELS", value: "1s 5s 1x", want: `"1x" (level 3): unknown unit "x"`, err: levels.ErrBadDuration},
		{name: "DELAYD_LEVELS", value: "90s 1m30s", want: "same delay", err: levels.ErrDuplicate},
		{name: "DELAYD_LEVELS", value: "5s 1s", want: "strictly increasing", err: levels.ErrNotIncreasing},
		{name: "DELAYD_LEVELS", value: " ", want: "no durations", err: levels.ErrEmptyTable},
		{name: "DELAYD_PARTITIONS", value: "7s=2", want: "not a level of the table", err: levels.ErrBadPartitions},
		{name: "DELAYD_PARTITIONS", value: "1m=0", want: "want an integer from 1 to 64", err: levels.ErrBadPartitions},
		{name: "DELAYD_PARTITIONS", value: "1m=65", want: "want an integer from 1 to 64", err: levels.ErrBadPartitions},
		{name: "DELAYD_PARTITIONS", value: "1m=two", want: "want an integer from 1 to 64", err: levels.ErrBadPartitions},
		{name: "DELAYD_PARTITIONS", value: "1m=2 60s=4", want: "level 1m is given twice", err: levels.ErrBadPartitions},
		{name: "DELAYD_PARTITIONS", value: "1m", want: "want <level delay>=<count>", err: levels.ErrBadPartitions},
		{name: "DELAYD_PARTITIONS", value: "1x=2", want: `unknown unit "x"`, err: levels.ErrBadPartitions},
		{name: "DELAYD_INGRESS_PARTITIONS", value: "0", want: "must be between 1 and 64"},
		{name: "DELAYD_INGRESS_PARTITIONS", value: "65", want: "must be between 1 and 64"},
		{name: "DELAYD_INGRESS_PARTITIONS", value: "four", want: "must be an integer between 1 and 64"},
		{name: "DELAYD_PREFIX", value: "delayd", want: "reserved"},
		{name: "DELAYD_PREFIX", value: "$JS", want: "'$'"},
		{name: "DELAYD_PREFIX", value: "a..b", want: "empty tokens"},
		{name: "DELAYD_HTTP_ADDR", value: "8223", want: "host:port"},
		{name: "DELAYD_REPLICAS", value: "abc", want: "must be an integer between 1 and 5"},
		{name: "DELAYD_REPLICAS", value: "9", want: "must be between 1 and 5"},
		{name: "DELAYD_REPLICAS", value: "0", want: "must be between 1 and 5"},
		{name: "DELAYD_LOG_FORMAT", value: "xml", want: "text, json or auto"},
		{name: "DELAYD_PRECISION", value: "no", want: "must be on (precision levels"},
		{name: "DELAYD_PRECISION", value: "", want: "must be on (precision levels"},
		{name: "DELAYD_LOG_LEVEL", value: "trace", want: "debug, info, warn or error"},
		{name: "DELAYD_START_GRACE", value: "soon", want: "Go duration"},
		{name: "DELAYD_START_GRACE", value: "-1s", want: "must be >= 0"},
		{name: "DELAYD_LEASE_TTL", value: "soon", want: "Go duration"},
		{name: "DELAYD_LEASE_TTL", value: "100ms", want: "from 250ms to 1m0s"},
		{name: "DELAYD_LEASE_TTL", value: "1m1s", want: "from 250ms to 1m0s"},
		{name: "DELAYD_ANSWER_KEEP", value: "soon", want: "Go duration"},
		{name: "DELAYD_ANSWER_KEEP", value: "500ms", want: "from 1s to 720h"},
		{name: "DELAYD_ANSWER_KEEP", value: "-1s", want: "from 1s to 720h"},
		{name: "DELAYD_ANSWER_KEEP", value: "721h0m0s", want: "from 1s to 720h"},
		{name: "DELAYD_ANSWER_MAX_BYTES", value: "4GB", want: "whole number of bytes"},
		{name: "DELAYD_ANSWER_MAX_BYTES", value: "1KiB", want: "at least 1MiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			clearEnv(t)
			t.Setenv(tt.name, tt.value)

			_, err := Load()
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Load() error = %v, want %v", err, ErrInvalid)
			}
			if tt.err != nil && !errors.Is(err, tt.err) {
				t.Errorf("Load() error = %v, want it to wrap %v", err, tt.err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.name+"="+strconv.Quote(tt.value)) {
				t.Errorf("Load() error = %q, want it to name %s=%q", msg, tt.name, tt.value)
			}
			if !strings.Contains(msg, tt.want) {
				t.Errorf("Load() error = %q, want it to contain %q", msg, tt.want)
			}
			var ve *VarError
			if !errors.As(err, &ve) || ve.Var != tt.name {
				t.Errorf("Load() error = %#v, want a *VarError for %s", err, tt.name)
			}
		})
	}
}

// TestLoadIngressPartitionsNotDividing: a level count in DELAYD_PARTITIONS that is not a multiple of
// DELAYD_INGRESS_PARTITIONS fails, the error naming both variables; a multiple loads.
func TestLoadIngressPartitionsNotDividing(t *testing.T) {
	clearEnv(t)
	t.Setenv("DELAYD_INGRESS_PARTITIONS", "4")
	t.Setenv("DELAYD_PARTITIONS", "1m=6")
	_, err := Load()
	var ve *VarError
	if !errors.As(err, &ve) || ve.Var != "DELAYD_PARTITIONS" || !errors.Is(err, levels.ErrBadPartitions) {
		t.Fatalf("Load() error = %v, want a *VarError for DELAYD_PARTITIONS wrapping levels.ErrBadPartitions", err)
	}
	if msg := err.Error(); !strings.Contains(msg, `DELAYD_PARTITIONS="1m=6"`) || !strings.Contains(msg, "DELAYD_INGRESS_PARTITIONS=4") ||
		!strings.Contains(msg, "not a multiple") {
		t.Errorf("Load() error = %q, want it to name both variables and say the count is not a multiple", msg)
	}
	t.Setenv("DELAYD_PARTITIONS", "1m=8")
	cfg, err := Load()
	if err != nil {
		t.Fatalf("Load() with 1m=8 and 4 ingress partitions: %v", err)
	}
	if cfg.IngressPartitions != 4 {
		t.Errorf("IngressPartitions = %d, want 4", cfg.IngressPartitions)
	}
}

func TestLoadGoodNATSURL(t *testing.T) {
	for _, value := range []string{
		"nats://127.0.0.1:4222",
		"tls://nats.example.com:4443",
		"ws://a:8080, wss://b",
		"localhost",
		"localhost:4222",
		"[::1]:4222",
		"nats://user:secret@a:4222,nats://b:4222,",
	} {
		t.Run(value, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("DELAYD_NATS_URL", value)
			c, err := Load()
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if c.NATSURL != value {
				t.Errorf("NATSURL = %q, want %q", c.NATSURL, value)
			}
		})
	}
}

func TestValidateRedactsPassword(t *testing.T) {
	t.Parallel()

	c := validConfig()
	c.NATSURL = "nats://user:secret@a:4222,http://b"
	err := c.Validate()
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("Validate() error = %v, want an error without the password", err)
	}
}

func TestValidateJoinsErrors(t *testing.T) {
	t.Parallel()

	c := validConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate() of a valid config: %v", err)
	}
	c.Replicas = 9
	c.LogLevel = "loud"
	c.Levels = levels.Table{}
	err := c.Validate()
	if !errors.Is(err, ErrInvalid) || !errors.Is(err, levels.ErrEmptyTable) {
		t.Fatalf("Validate() error = %v, want %v and %v", err, ErrInvalid, levels.ErrEmptyTable)
	}
	for _, want := range []string{`DELAYD_REPLICAS="9": must be between 1 and 5`, `DELAYD_LOG_LEVEL="loud"`, `DELAYD_LEVELS=""`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() error = %q, want it to contain %q", err, want)
		}
	}
}

func TestValidateHTTPAddrPortZero(t *testing.T) {
	t.Parallel()

	c := validConfig()
	c.HTTPAddr = "127.0.0.1:0"
	if err := c.Validate(); err != nil {
		t.Errorf("Validate() with HTTPAddr %q: %v", c.HTTPAddr, err)
	}
}

func TestSlogLevel(t *testing.T) {
	t.Parallel()

	for value, want := range map[string]slog.Level{
		"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError,
		"ERROR": slog.LevelError,
	} {
		if got := (Config{LogLevel: value}).SlogLevel(); got != want {
			t.Errorf("SlogLevel() for %q = %v, want %v", value, got, want)
		}
	}
}

func TestValidatePrefix(t *testing.T) {
	t.Parallel()

	tests := []struct {
		prefix string
		ok     bool
	}{
		{prefix: "delay", ok: true},
		{prefix: "sched.in", ok: true},
		{prefix: "Delayd", ok: true}, // subjects are case-sensitive
		{prefix: "delayd2", ok: true},
		{prefix: "my-app_delay.v1", ok: true},
		{prefix: "delayd"},
		{prefix: "delayd.x"},
		{prefix: "$JS"},
		{prefix: "$SYS.x"},
		{prefix: "_INBOX"},
		{prefix: "_INBOX.x"},
		{prefix: ""},
		{prefix: "a..b"},
		{prefix: ".a"},
		{prefix: "a."},
		{prefix: "a.*"},
		{prefix: "a.>"},
		{prefix: "*"},
		{prefix: "a*b"},
		{prefix: "a b"},
		{prefix: "a\tb"},
		{prefix: "a\x00b"},
		{prefix: "a\x7fb"},
		{prefix: "a\xffb"},
	}
	for _, tt := range tests {
		err := ValidatePrefix(tt.prefix)
		if tt.ok && err != nil {
			t.Errorf("ValidatePrefix(%q) = %v, want nil", tt.prefix, err)
		}
		if !tt.ok && !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidatePrefix(%q) = %v, want %v", tt.prefix, err, ErrInvalid)
		}
	}
}

// validConfig returns the configuration of an empty environment.
func validConfig() Config { return defaults() }

func TestMaxDelay(t *testing.T) {
	clearEnv(t)
	t.Setenv("DELAYD_MAX_DELAY", "36h")
	c, err := Load()
	if err != nil || c.MaxDelay != 36*time.Hour {
		t.Fatalf("Load() MaxDelay = %s, %v; want 36h", c.MaxDelay, err)
	}
	for _, bad := range []string{"0s", "-1h", "a week"} {
		t.Setenv("DELAYD_MAX_DELAY", bad)
		if _, err := Load(); err == nil || !strings.Contains(err.Error(), "DELAYD_MAX_DELAY") {
			t.Errorf("DELAYD_MAX_DELAY=%q: %v, want an error naming the variable", bad, err)
		}
	}
}

func TestCancelShare(t *testing.T) {
	clearEnv(t)
	if c, err := Load(); err != nil || c.CancelShare != 0.1 {
		t.Fatalf("Load() CancelShare = %v, %v; want the default 0.1", c.CancelShare, err)
	}
	t.Setenv("DELAYD_CANCEL_SHARE", "0.5")
	if c, err := Load(); err != nil || c.CancelShare != 0.5 {
		t.Fatalf("Load() CancelShare = %v, %v; want 0.5", c.CancelShare, err)
	}
	t.Setenv("DELAYD_CANCEL_SHARE", "1")
	if c, err := Load(); err != nil || c.CancelShare != 1 {
		t.Fatalf("Load() CancelShare = %v, %v; want 1", c.CancelShare, err)
	}
	for _, bad := range []string{"0", "-0.1", "1.5", "NaN", "a tenth"} {
		t.Setenv("DELAYD_CANCEL_SHARE", bad)
		if _, err := Load(); err == nil || !strings.Contains(err.Error(), "DELAYD_CANCEL_SHARE") {
			t.Errorf("DELAYD_CANCEL_SHARE=%q: %v, want an error naming the variable", bad, err)
		}
	}
}

// TestLoadPrecision: DELAYD_PRECISION=off (any case) loads the level table without precision levels, the table
// itself unchanged; on, or unset, with them.
func TestLoadPrecision(t *testing.T) {
	for value, want := range map[string]int{"": 10, "on": 10, "ON": 10, "off": 0, "Off": 0} {
		t.Run(value, func(t *testing.T) {
			clearEnv(t)
			if value != "" {
				t.Setenv("DELAYD_PRECISION", value)
			}
			c, err := Load()
			if err != nil {
				t.Fatal(err)
			}
			if n := len(c.Levels.PrecisionLevels()); n != want || c.Levels.String() != levels.DefaultTable {
				t.Errorf("DELAYD_PRECISION=%q: %d precision levels, table %q; want %d and the default table", value, n, c.Levels, want)
			}
		})
	}
}

// TestAnswerKeepOff: DELAYD_ANSWER_KEEP 0 or "off" turns kept answers
// off (AnswerKeep 0, shown as "off"); a duration keeps them that long.
func TestAnswerKeepOff(t *testing.T) {
	for _, tt := range []struct {
		value string
		want  OffDuration
		str   string
	}{
		{"0", 0, "off"},
		{"0s", 0, "off"},
		{"off", 0, "off"},
		{"2h", OffDuration(2 * time.Hour), "2h0m0s"},
	} {
		t.Run(tt.value, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("DELAYD_ANSWER_KEEP", tt.value)
			c, err := Load()
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if c.AnswerKeep != tt.want || c.AnswerKeep.String() != tt.str {
				t.Errorf("AnswerKeep = %v (%s), want %v (%s)", time.Duration(c.AnswerKeep), c.AnswerKeep, time.Duration(tt.want), tt.str)
			}
		})
	}
}

// TestConsoleToken: a short DELAYD_CONSOLE_TOKEN, or one with a space or a non-ASCII character, fails at start naming
// the variable and never printing the token; a good one loads.
func TestConsoleToken(t *testing.T) {
	for _, tt := range []struct{ value, want string }{
		{"short", "at least 16 characters"},
		{"sixteen chars ok", "printable ASCII without spaces"},
		{"sixteen-chars-é-ok", "printable ASCII without spaces"},
	} {
		t.Run(tt.value, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("DELAYD_CONSOLE_TOKEN", tt.value)
			_, err := Load()
			var ve *VarError
			if !errors.As(err, &ve) || ve.Var != "DELAYD_CONSOLE_TOKEN" || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load() error = %v, want DELAYD_CONSOLE_TOKEN: %s", err, tt.want)
			}
			if strings.Contains(err.Error(), tt.value) {
				t.Errorf("Load() error = %q prints the token", err)
			}
		})
	}
	clearEnv(t)
	t.Setenv("DELAYD_CONSOLE_TOKEN", "0123456789abcdef")
	if c, err := Load(); err != nil || string(c.ConsoleToken) != "0123456789abcdef" {
		t.Errorf("Load() with a good token: %v, %v", c.ConsoleToken, err)
	}
}

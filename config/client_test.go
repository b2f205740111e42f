package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/delayd/delayd/levels"
)

func TestLoadClientDefaults(t *testing.T) {
	clearEnv(t)

	c, err := LoadClient()
	if err != nil {
		t.Fatalf("LoadClient: %v", err)
	}
	want := Client{NATSURL: ClientURLDefault, Levels: levels.Default(), Precision: PrecisionDefault, Prefix: PrefixDefault}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("LoadClient() = %+v, want %+v", c, want)
	}
	if opts, err := c.NATSOptions(); err != nil || len(opts) != 0 {
		t.Errorf("NATSOptions() = %d options, %v; want none", len(opts), err)
	}
}

// TestLoadClientIgnoresServerVars: a client reads only its own variables, so a value only delayd cares about cannot
// fail it.
func TestLoadClientIgnoresServerVars(t *testing.T) {
	clearEnv(t)
	t.Setenv("DELAYD_REPLICAS", "9")
	t.Setenv("DELAYD_STORE_DIR", "")
	t.Setenv("DELAYD_LOG_LEVEL", "loud")

	if _, err := LoadClient(); err != nil {
		t.Fatalf("LoadClient: %v", err)
	}
}

// TestLoadClientListen: with DELAYD_NATS_URL empty, a client connects to DELAYD_LISTEN, the embedded server's
// address (an unspecified host on loopback); DELAYD_NATS_URL wins over it; a bad DELAYD_LISTEN names the variable.
func TestLoadClientListen(t *testing.T) {
	for _, tc := range []struct{ listen, url, want string }{
		{"127.0.0.1:4333", "", "nats://127.0.0.1:4333"},
		{"0.0.0.0:4334", "", "nats://127.0.0.1:4334"},
		{"[::]:4335", "", "nats://127.0.0.1:4335"},
		{":4336", "", "nats://127.0.0.1:4336"},
		{"[::1]:4337", "", "nats://[::1]:4337"},
		{"127.0.0.1:4333", "nats://nats.example.com:4222", "nats://nats.example.com:4222"},
		{"", "", ClientURLDefault},
	} {
		clearEnv(t)
		t.Setenv("DELAYD_LISTEN", tc.listen)
		t.Setenv("DELAYD_NATS_URL", tc.url)
		c, err := LoadClient()
		if err != nil || c.NATSURL != tc.want {
			t.Errorf("DELAYD_LISTEN=%q DELAYD_NATS_URL=%q: NATSURL %q, %v; want %q", tc.listen, tc.url, c.NATSURL, err, tc.want)
		}
	}
	// A --server flag (an override) wins too.
	clearEnv(t)
	t.Setenv("DELAYD_LISTEN", "127.0.0.1:4333")
	if c, err := LoadClient(func(c *Client) { c.NATSURL = "nats://10.0.0.1:4222" }); err != nil || c.NATSURL != "nats://10.0.0.1:4222" {
		t.Errorf("override: NATSURL %q, %v", c.NATSURL, err)
	}

	clearEnv(t)
	t.Setenv("DELAYD_LISTEN", "nonsense")
	_, err := LoadClient()
	var ve *VarError
	if !errors.As(err, &ve) || ve.Var != "DELAYD_LISTEN" {
		t.Errorf("DELAYD_LISTEN=nonsense: %v, want an error naming DELAYD_LISTEN", err)
	}
}

func TestLoadClientValues(t *testing.T) {
	clearEnv(t)
	t.Setenv("DELAYD_NATS_URL", "nats://nats.example.com:4222")
	t.Setenv("DELAYD_LEVELS", "100ms 1s")
	t.Setenv("DELAYD_PREFIX", "sched")
	t.Setenv("DELAYD_NATS_TOKEN", "s3cret")

	c, err := LoadClient()
	if err != nil {
		t.Fatalf("LoadClient: %v", err)
	}
	if c.NATSURL != "nats://nats.example.com:4222" || c.Levels.String() != "100ms 1s" || c.Prefix != "sched" || c.NATSToken != "s3cret" {
		t.Errorf("LoadClient() = %+v", c)
	}
	if c.AuthMethod() != "token" {
		t.Errorf("AuthMethod() = %q, want token", c.AuthMethod())
	}
	if opts, err := c.NATSOptions(); err != nil || len(opts) != 1 {
		t.Errorf("NATSOptions() = %d options, %v; want 1", len(opts), err)
	}
}

// TestLoadClientOverrides: overrides (a CLI's flags) win over the environment, and are validated too.
func TestLoadClientOverrides(t *testing.T) {
	clearEnv(t)
	t.Setenv("DELAYD_NATS_URL", "nats://from-env:4222")
	t.Setenv("DELAYD_PREFIX", "fromenv")

	c, err := LoadClient(func(c *Client) { c.NATSURL = "nats://from-flag:4222" })
	if err != nil {
		t.Fatalf("LoadClient: %v", err)
	}
	if c.NATSURL != "nats://from-flag:4222" || c.Prefix != "fromenv" {
		t.Errorf("LoadClient() = %+v, want the flag's URL and the environment's prefix", c)
	}

	_, err = LoadClient(func(c *Client) { c.Prefix = "delayd.x" })
	var ve *VarError
	if !errors.As(err, &ve) || ve.Var != "DELAYD_PREFIX" || !errors.Is(err, ErrInvalid) {
		t.Errorf("LoadClient with a bad prefix override: %v, want a DELAYD_PREFIX VarError", err)
	}
}

func TestLoadClientBad(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		wantVar string
		want    string
	}{
		{map[string]string{"DELAYD_NATS_URL": "http://x:1"}, "DELAYD_NATS_URL", "not a server URL"},
		{map[string]string{"DELAYD_LEVELS": "5s 1s"}, "DELAYD_LEVELS", "increasing"},
		{map[string]string{"DELAYD_PREFIX": "$JS"}, "DELAYD_PREFIX", "'$'"},
		{map[string]string{"DELAYD_NATS_USER": "u"}, "DELAYD_NATS_USER", "DELAYD_NATS_PASSWORD"},
		{map[string]string{"DELAYD_NATS_TOKEN": "t", "DELAYD_NATS_CREDS": "/nonexistent"}, "DELAYD_NATS_CREDS", "at most one"},
		{map[string]string{"DELAYD_NATS_CREDS": "/nonexistent/x.creds"}, "DELAYD_NATS_CREDS", "does not exist"},
	} {
		t.Run(tc.wantVar+" "+tc.want, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := LoadClient()
			var ve *VarError
			if !errors.As(err, &ve) || !strings.Contains(err.Error(), tc.wantVar) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadClient() error = %v, want a %s error containing %q", err, tc.wantVar, tc.want)
			}
			if strings.Contains(err.Error(), "=\"t\"") {
				t.Errorf("error prints the token: %v", err)
			}
		})
	}
}

// TestClientTagsMatchConfig: every Client field reads the same variable, with the same tags, as Config's field of
// the same name, so the two never drift apart.
func TestClientTagsMatchConfig(t *testing.T) {
	t.Parallel()
	ct, cfg := reflect.TypeFor[Client](), reflect.TypeFor[Config]()
	for _, f := range reflect.VisibleFields(ct) { // the fields of an embedded struct (NATSAuth) too
		g, ok := cfg.FieldByName(f.Name)
		if !ok {
			t.Errorf("Client.%s has no Config field", f.Name)
			continue
		}
		if f.Type != g.Type || f.Tag.Get("envconfig") != g.Tag.Get("envconfig") || f.Tag.Get("default") != g.Tag.Get("default") {
			t.Errorf("Client.%s (%s %q) differs from Config.%s (%s %q)", f.Name, f.Type, f.Tag, g.Name, g.Type, g.Tag)
		}
	}
}

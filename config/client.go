package config

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/levels"
)

// ClientURLDefault is the server a client of delayd (delayctl) connects to when DELAYD_NATS_URL and DELAYD_LISTEN
// are empty: the embedded server's default listen address, [ListenDefault].
const ClientURLDefault = "nats://" + ListenDefault

// Client is the part of [Config] that a client of a running delayd needs, such as the delayctl operator CLI: where
// the NATS server is, how to authenticate to it, and delayd's ingress prefix and level table. [LoadClient] reads it
// from the same DELAYD_* variables delayd reads, and only those, so a client never fails on a delayd-only variable
// (DELAYD_STORE_DIR, DELAYD_REPLICAS, ...).
type Client struct {
	// NATSURL is the server list, as [Config].NATSURL.
	// Optional. Default nats://<Listen> when Listen is set (a shell with an embedded delayd's environment reaches
	// its server), else [ClientURLDefault] (unlike delayd, a client never embeds a server).
	NATSURL string `envconfig:"DELAYD_NATS_URL"`

	// Listen is the embedded server's listen address, as [Config].Listen: host:port. It is used only when NATSURL
	// is empty; an unspecified host (0.0.0.0, ::, empty) is reached on 127.0.0.1. Optional. Default: none.
	Listen string `envconfig:"DELAYD_LISTEN"`

	// Levels is delayd's level table, as [Config].Levels. Optional. Default [levels.DefaultTable].
	Levels levels.Table `envconfig:"DELAYD_LEVELS"`

	// Precision is delayd's DELAYD_PRECISION, as [Config].Precision: with "off", [LoadClient] returns Levels
	// without precision levels, and `delayctl levels` lists none. Optional. Default [PrecisionDefault].
	Precision string `envconfig:"DELAYD_PRECISION"`

	// Partitions is delayd's partition list, as [Config].Partitions: `delayctl levels` lists a partitioned level's
	// streams. Optional. Default "": none.
	Partitions levels.Partitions `envconfig:"DELAYD_PARTITIONS"`

	// IngressPartitions is delayd's ingress partition count, as [Config].IngressPartitions: with it above 1 every
	// level is partitioned, and `delayctl levels` lists each level's partition streams. Optional. Default 1.
	IngressPartitions int `envconfig:"DELAYD_INGRESS_PARTITIONS"`

	// Prefix is delayd's ingress subject prefix, as [Config].Prefix. Optional. Default [PrefixDefault].
	Prefix string `envconfig:"DELAYD_PREFIX"`

	// NATSAuth holds the authentication and TLS settings, as [Config] embeds it. Optional. Default: none.
	NATSAuth
}

// LoadClient reads the [Client] variables from the environment, applies each override in order (a CLI's flags,
// which win over the environment), fills the defaults and validates the result with [Client.Validate]. Like [Load],
// it looks variables up by their full DELAYD_* names only.
func LoadClient(overrides ...func(*Client)) (Client, error) {
	var c Client
	if err := envconfig.Process("", &c); err != nil {
		var pe *envconfig.ParseError
		if errors.As(err, &pe) {
			return Client{}, &VarError{Var: pe.KeyName, Value: pe.Value, Reason: parseReason(pe), Err: pe.Err}
		}
		return Client{}, fmt.Errorf("config: %w", err)
	}
	for _, o := range overrides {
		o(&c)
	}
	if c.NATSURL == "" && c.Listen != "" {
		url, err := listenURL(c.Listen)
		if err != nil {
			return Client{}, &VarError{Var: "DELAYD_LISTEN", Value: c.Listen, Reason: err.Error() + " (used as the server to connect to, since DELAYD_NATS_URL is empty)"}
		}
		c.NATSURL = url
	}
	if c.NATSURL == "" {
		c.NATSURL = ClientURLDefault
	}
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	if c.Levels.Len() == 0 {
		c.Levels = levels.Default()
	}
	if c.Precision == "" {
		c.Precision = PrecisionDefault
	}
	if err := c.Validate(); err != nil {
		return Client{}, err
	}
	if !precisionOn(c.Precision) {
		c.Levels = c.Levels.WithoutPrecision()
	}
	return c, nil
}

// listenURL is the client URL of an embedded server listening on listen (host:port).
func listenURL(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("want host:port: %w", err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "nats://" + net.JoinHostPort(host, port), nil
}

// Validate checks the server list, the prefix, the level table and the authentication and TLS settings as
// [Config.Validate] does, and returns nil or the errors joined, each a [*VarError] naming the variable. An empty
// NATSURL is an error here: [LoadClient] fills [ClientURLDefault] in.
func (c Client) Validate() error {
	var errs []error
	if c.NATSURL == "" {
		errs = append(errs, &VarError{Var: "DELAYD_NATS_URL", Reason: "must not be empty for a client (want nats://host:port)"})
	} else if err := validateNATSURL(c.NATSURL); err != nil {
		errs = append(errs, &VarError{Var: "DELAYD_NATS_URL", Value: RedactURLs(c.NATSURL), Reason: err.Error()})
	}
	if reason := prefixReason(c.Prefix); reason != "" {
		errs = append(errs, &VarError{Var: "DELAYD_PREFIX", Value: c.Prefix, Reason: reason})
	}
	if c.Levels.Len() == 0 {
		errs = append(errs, &VarError{Var: "DELAYD_LEVELS", Reason: "must hold at least one level", Err: levels.ErrEmptyTable})
	} else if err := c.Partitions.WithIngress(c.IngressPartitions).Check(c.Levels); err != nil {
		errs = append(errs, &VarError{Var: "DELAYD_PARTITIONS", Value: c.Partitions.String(), Reason: err.Error(), Err: err})
	}
	if reason := precisionReason(c.Precision); reason != "" {
		errs = append(errs, &VarError{Var: "DELAYD_PRECISION", Value: c.Precision, Reason: reason})
	}
	if c.IngressPartitions < 0 || c.IngressPartitions > levels.PartitionsMax {
		errs = append(errs, &VarError{Var: "DELAYD_INGRESS_PARTITIONS", Value: strconv.Itoa(c.IngressPartitions),
			Reason: fmt.Sprintf("must be between 1 and %d", levels.PartitionsMax)})
	}
	if c.NATSURL != "" {
		errs = append(errs, c.config().validateSecurity()...)
	}
	return errors.Join(errs...)
}

// NATSOptions returns the nats.go options for the authentication and TLS settings, as [Config.NATSOptions] does.
// Call it after [Client.Validate].
func (c Client) NATSOptions() ([]nats.Option, error) { return c.config().NATSOptions() }

// AuthMethod names the authentication method, as [Config.AuthMethod] does.
func (c Client) AuthMethod() string { return c.config().AuthMethod() }

// config returns c as a Config, for the checks and options the two share.
func (c Client) config() Config {
	return Config{
		NATSURL: c.NATSURL, Levels: c.Levels, Partitions: c.Partitions, Prefix: c.Prefix,
		NATSAuth: c.NATSAuth,
	}
}

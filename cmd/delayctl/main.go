// Command delayctl is the operator CLI of a running delayd: its level table,
// per-level stats (once or live), publishing, cancelling, listing, showing
// and rescheduling delayed messages, and listing and replaying dead letters.
//
// It connects to delayd's NATS server with the same DELAYD_NATS_URL and
// authentication and TLS variables as delayd (flags override them), and
// reads DELAYD_PREFIX and DELAYD_LEVELS as delayd does. See
// docs/operations.md#delayctl and `delayctl --help`.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/delayd/delayd/config"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/levels"
)

// Exit codes; docs/operations.md#delayctl and `delayctl --help` list them.
const (
	exitOK               = 0
	exitError            = 1 // a runtime failure
	exitUsage            = 2 // bad flags, arguments or configuration
	exitConnect          = 3 // cannot connect to the NATS server
	exitNoStreams        = 4 // the server holds no delayd streams
	exitNotFound         = 5 // cancel, status, show, reschedule: no pending message has the id
	exitAlreadyDelivered = 6 // cancel, status, show, reschedule: the message was already delivered
	exitDuplicate        = 7 // pub: ingress dropped the message as a duplicate of its --id; nothing stored
	exitCancelled        = 8 // status: the message was cancelled
)

const exitCodesHelp = `Exit codes:
  0  ok
  1  error (including: no delayd answered a cancel request; dlq replay left letters in the dead-letter stream)
  2  usage: bad flags, arguments or configuration (reschedule: a delay beyond delayd's longest)
  3  cannot connect to the NATS server
  4  no delayd streams on the server (DELAYD_INGRESS or DELAYD_DLQ missing)
  5  cancel, status, show, reschedule: not found
  6  cancel, status, show, reschedule: already delivered
  7  pub: nothing stored: the ingress stream dropped the message as a duplicate of its --id
  8  status, show: cancelled`

// codeError is an error with its exit code.
type codeError struct {
	code int
	err  error
}

func (e *codeError) Error() string { return e.err.Error() }
func (e *codeError) Unwrap() error { return e.err }

func withCode(code int, format string, args ...any) error {
	return &codeError{code: code, err: fmt.Errorf(format, args...)}
}

// exitCode returns err's exit code: its codeError's, else exitError.
func exitCode(err error) int {
	var ce *codeError
	if errors.As(err, &ce) {
		return ce.code
	}
	return exitError
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes delayctl with args and returns its exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// A permissions violation the server reports for a subject delayctl waits on ends the run at once (see
	// [app.asyncError]), instead of when the request's timeout passes.
	ctx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	app := &app{stdin: stdin, stdout: stdout, stderr: stderr, abort: abort}
	root := app.rootCmd()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if app.nc != nil {
		app.nc.Close()
	}
	if err == nil {
		return exitOK
	}
	if cause := context.Cause(ctx); errors.Is(cause, nats.ErrPermissionViolation) {
		err = &codeError{code: exitError, err: cause}
	}
	code := exitCode(err)
	if !app.running {
		// cobra failed before a command ran: an unknown command or flag, or bad arguments.
		code = exitUsage
	}
	if !errors.Is(err, errSilent) {
		fmt.Fprintf(stderr, "delayctl: %v\n", err)
	}
	if code == exitUsage && !app.running {
		fmt.Fprintln(stderr, "Run 'delayctl --help' for usage.")
	}
	return code
}

// app holds the global flags and the connection of one run.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer

	server, creds, user, password, token, nkey, tlsCA, tlsCert, tlsKey, prefix, levels string
	timeout                                                                            time.Duration

	running bool                    // a command's PersistentPreRunE was reached: flags and arguments parsed
	abort   context.CancelCauseFunc // ends the run's context with a cause
	cfg     config.Client
	nc      *nats.Conn
	js      jetstream.JetStream
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "delayctl",
		Short: "Operate a running delayd: levels, stats, publish, cancel, status, list, show and reschedule pending, dead letters",
		Long: `delayctl is the operator CLI of delayd, delayed delivery for NATS JetStream.

It connects to delayd's NATS server as delayd does: DELAYD_NATS_URL (when empty:
nats://<DELAYD_LISTEN>, delayd's embedded server; with neither, ` + config.ClientURLDefault + `), DELAYD_NATS_USER and
DELAYD_NATS_PASSWORD, DELAYD_NATS_TOKEN, DELAYD_NATS_NKEY_SEED, DELAYD_NATS_CREDS,
DELAYD_NATS_TLS_CA, DELAYD_NATS_TLS_CERT and DELAYD_NATS_TLS_KEY. It reads
DELAYD_PREFIX, DELAYD_LEVELS and DELAYD_PRECISION as delayd does: set them as delayd has them.
Flags override the variables.

` + exitCodesHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			a.running = true
			return a.loadConfig(cmd)
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &codeError{code: exitUsage, err: err} })
	f := root.PersistentFlags()
	f.StringVarP(&a.server, "server", "s", "", "NATS server URL(s), comma-separated (env DELAYD_NATS_URL; default nats://<DELAYD_LISTEN>, or "+config.ClientURLDefault+")")
	f.StringVar(&a.creds, "creds", "", "path of a .creds file (env DELAYD_NATS_CREDS)")
	f.StringVar(&a.user, "user", "", "user name, with --password (env DELAYD_NATS_USER)")
	f.StringVar(&a.password, "password", "", "password (env DELAYD_NATS_PASSWORD)")
	f.StringVar(&a.token, "token", "", "token (env DELAYD_NATS_TOKEN)")
	f.StringVar(&a.nkey, "nkey", "", "path of an NKey user seed file (env DELAYD_NATS_NKEY_SEED)")
	f.StringVar(&a.tlsCA, "tlsca", "", "path of a PEM CA file verifying the server (env DELAYD_NATS_TLS_CA)")
	f.StringVar(&a.tlsCert, "tlscert", "", "path of a PEM client certificate, with --tlskey (env DELAYD_NATS_TLS_CERT)")
	f.StringVar(&a.tlsKey, "tlskey", "", "path of the client certificate's PEM key (env DELAYD_NATS_TLS_KEY)")
	f.StringVar(&a.prefix, "prefix", "", "delayd's ingress subject prefix (env DELAYD_PREFIX; default "+config.PrefixDefault+")")
	f.StringVar(&a.levels, "levels", "", "delayd's level table (env DELAYD_LEVELS; default delayd's 18 levels)")
	f.DurationVar(&a.timeout, "timeout", 5*time.Second, "timeout of each request to the server or delayd")

	root.AddCommand(a.levelsCmd(), a.statsCmd(), a.watchCmd(), a.pubCmd(), a.cancelCmd(), a.statusCmd(), a.lsCmd(), a.showCmd(), a.rescheduleCmd(), a.dlqCmd())
	return root
}

// loadConfig reads the DELAYD_* variables and applies the flags set on the command line over them.
func (a *app) loadConfig(cmd *cobra.Command) error {
	flags := cmd.Flags()
	var table levels.Table
	if flags.Changed("levels") {
		t, err := levels.Parse(a.levels)
		if err != nil {
			return withCode(exitUsage, "--levels %q: %w", a.levels, err)
		}
		table = t
	}
	set := func(name string, dst *string, v string) {
		if flags.Changed(name) {
			*dst = v
		}
	}
	cfg, err := config.LoadClient(func(c *config.Client) {
		set("server", &c.NATSURL, a.server)
		set("creds", &c.NATSCreds, a.creds)
		set("user", &c.NATSUser, a.user)
		if flags.Changed("password") {
			c.NATSPassword = config.Secret(a.password)
		}
		if flags.Changed("token") {
			c.NATSToken = config.Secret(a.token)
		}
		set("nkey", &c.NATSNKeySeed, a.nkey)
		set("tlsca", &c.NATSTLSCA, a.tlsCA)
		set("tlscert", &c.NATSTLSCert, a.tlsCert)
		set("tlskey", &c.NATSTLSKey, a.tlsKey)
		set("prefix", &c.Prefix, a.prefix)
		if table.Len() > 0 {
			c.Levels = table
		}
	})
	if err != nil {
		return withCode(exitUsage, "bad configuration (a flag overrides the variable of the same setting): %w", err)
	}
	if a.timeout <= 0 {
		return withCode(exitUsage, "--timeout %s: must be positive", a.timeout)
	}
	a.cfg = cfg
	return nil
}

// connect dials the server once (no retries: an operator wants to know now).
func (a *app) connect() error {
	opts, err := a.cfg.NATSOptions()
	if err != nil {
		return withCode(exitUsage, "bad configuration: %w", err)
	}
	opts = append(opts, nats.Name("delayctl"), nats.Timeout(a.timeout), nats.MaxReconnects(0), nats.ErrorHandler(a.asyncError))
	nc, err := nats.Connect(a.cfg.NATSURL, opts...)
	if err != nil {
		return withCode(exitConnect, "cannot connect to %s: is delayd running? (%v)", config.RedactURLs(a.cfg.NATSURL), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return err
	}
	a.nc, a.js = nc, js
	return nil
}

// errPermissionDenied is the cause of a run ended by a permissions violation.
var errPermissionDenied = errors.New("permission denied")

// violationRe finds the subject of a permissions violation nats.go reports:
// `Permissions Violation for Publish to "delayd.api.cancel.orders.close"`.
var violationRe = regexp.MustCompile(`Permissions Violation for (Publish|Subscription) to "([^"]*)"`)

// asyncError is the connection's async error handler. A permissions violation is the server refusing a publish
// or subscription of delayctl's NATS user; nats.go reports it only here (a request to a denied subject is not
// answered, so it would wait for its whole timeout). Every such publish is a request delayctl waits on, so the
// violation ends the run at once, with exit code 1, unless it names an optional request whose caller copes
// without an answer: the info API (delayd.Publish then makes only the checks that need no configuration) and the
// stats API (stats shows the counters as unknown).
func (a *app) asyncError(_ *nats.Conn, _ *nats.Subscription, err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	verb, subject := "", ""
	if m := violationRe.FindStringSubmatch(err.Error()); m != nil {
		verb, subject = m[1], m[2]
	}
	if verb == "Publish" && (subject == contract.InfoSubject || subject == contract.StatsSubject) {
		return
	}
	what := "the server refused a publish or subscription"
	switch verb {
	case "Publish":
		what = fmt.Sprintf("this NATS user may not publish to %q", subject)
	case "Subscription":
		what = fmt.Sprintf("this NATS user may not subscribe to %q", subject)
	}
	a.abort(fmt.Errorf("%w: %s (%w)", errPermissionDenied, what, err))
}

// ctx returns a context for one request.
func (a *app) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.timeout)
}

// stream returns the info of one of delayd's own streams, or an exitNoStreams error if it is missing.
func (a *app) stream(ctx context.Context, name string) (jetstream.Stream, *jetstream.StreamInfo, error) {
	rctx, cancel := a.reqCtx(ctx)
	defer cancel()
	s, err := a.js.Stream(rctx, name)
	if err == nil {
		var info *jetstream.StreamInfo
		info, err = s.Info(rctx)
		if err == nil {
			return s, info, nil
		}
	}
	return nil, nil, noStreams(name, err)
}

// noStreams explains err, from reading delayd stream name, with the right exit code.
func noStreams(name string, err error) error {
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return withCode(exitNoStreams, "no delayd streams on this server (%s missing): is delayd running with this DELAYD_PREFIX/account?", name)
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount), errors.Is(err, nats.ErrNoResponders):
		return withCode(exitNoStreams, "no delayd streams on this server (JetStream is not enabled for this account): is delayd running with this account? (%v)", err)
	}
	return fmt.Errorf("read stream %s: %w", name, err)
}

// requireIngress connects and checks that delayd's ingress stream exists.
func (a *app) requireIngress(ctx context.Context) (*jetstream.StreamInfo, error) {
	if err := a.connect(); err != nil {
		return nil, err
	}
	_, info, err := a.stream(ctx, deliver.IngressStream)
	return info, err
}

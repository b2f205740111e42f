// Command delaybench measures delayd against references measured in the same
// run, on embedded nats-servers in the same process: raw JetStream (the
// ceiling of the machine) and NATS native message schedules (nats-server
// 2.12+, a stream with AllowMsgSchedules and one "Nats-Schedule: @at …"
// message per delayed message).
//
//	go run ./cmd/delaybench                       # the default scenarios, default sizes (≤ ~5 min on 2 cores before the 30k/s steady rows, which add about a minute)
//	go run ./cmd/delaybench -scenarios burst,steady -burst-n 200000
//	go run ./cmd/delaybench -json                 # one JSON object per row
//	go run ./cmd/delaybench -scenarios cluster    # the cluster scenario (not in the default set; ~3 min on 2 cores)
//	go run ./cmd/delaybench -scenarios raw,sustained  # the sustained scenario (not in the default set)
//	go run ./cmd/delaybench -tcp                  # nats-server and delayd as processes, over TCP
//
// With -tcp, every server is a nats-server process (the version in go.mod,
// built with go build into the run's temporary directory, so run it inside
// the module) on a loopback port the OS picks, every connection is TCP,
// and delayd runs as its own process (cmd/delayd, built the same way, with
// DELAYD_NATS_URL, DELAYD_LEVELS and an HTTP address of its own, ready
// when /readyz answers 200, stopped with SIGTERM by its PID). The burst
// rows' router alone still runs in this process, over TCP. pending and
// cluster have no -tcp mode (pending reads this process's heap; cluster
// starts its nodes in-process). Rows of a -tcp run carry transport "tcp".
//
// Each (scenario, system) pair gets a fresh embedded nats-server (JetStream,
// file storage in a temporary directory removed at exit, no logging, no
// signal handlers, a client connected in-process), so no run sees another's
// streams, backlog or garbage. delayd and native schedules run on the same
// server build and configuration. Payloads are 128 bytes by default; each
// starts with the message's index as 12 decimal digits, which is how
// messages are told apart and counted.
//
// Rows, by scenario:
//
//   - raw-publish, raw-read (system raw, target stream): the reference. N
//     async publishes (PublishMsgAsync, window 4,096) into a plain file
//     stream, msgs_per_s = N / time until the last PubAck; then an ordered
//     consumer reads them back, msgs_per_s = N / read time.
//   - ref-drain, ref-stream, ref-move, ref-timer (system raw): the
//     yardsticks, each a delayd row's work with the scheduling taken out,
//     on a fresh server with -burst-n messages preloaded into a stream SRC.
//     ref-drain (core): an ordered consumer (client buffer 8,192) reads SRC
//     and republishes each payload to a core subject; a core subscriber
//     counts them; msgs_per_s = N / (last arrival − start). ref-stream: the
//     same read, each published async (window 4,096) to a subject bound to
//     a stream; msgs_per_s = N / (last PubAck − start). ref-move: SRC is a
//     work queue read by a durable pull consumer; each message is published
//     async to another stream and acked once its PubAck is in (the router's
//     store operations without classification); msgs_per_s = N / (SRC empty
//     and the other stream holding N − start). ref-timer (core; a row per
//     steady rate, its rate in the row): at each of -steady-rates for
//     -steady-duration, a relay receives each message on a
//     core subscription, holds it in a Go timer until its due time (publish
//     time + 1 s) and publishes it to core; lateness = arrival − due, as in
//     steady. delayd's rows then carry their reference: burst core's
//     ref_ratio = msgs_per_s / ref-drain's, burst stream's / ref-stream's,
//     ingest's / ref-move's, and steady's over_ref_ms = its lateness −
//     ref-timer's at the same rate (p50, p99, max); ingest and burst rows
//     carry raw_ratio = msgs_per_s / raw-publish's.
//   - ingest (delayd): N messages are published to delay.bench.x with
//     Delay-Level 3 of the table "1s 5s 1h" while delayd is stopped; then a
//     delayd service starts and msgs_per_s = N / time from its start until
//     DELAYD_1H holds the N (its epoch markers not counted; the router's
//     rate, service start-up included).
//     early counts deliveries to bench.x, which none may see within the hour.
//   - burst (delayd and native; targets core and stream): N messages all due
//     by the same instant T. delayd: a router alone (no scanners) writes N
//     messages into DELAYD_1S; once the last is due, T is taken and the
//     service started. Lateness = arrival − max(Delay-Due-At, T); native:
//     N one-shot schedules "@at T" (nanoseconds) with T a few seconds ahead,
//     lateness = produced message's store time − T. msgs_per_s = N / (last
//     arrival − T). Core arrivals are time.Now() in a core subscriber; stream
//     arrivals are store timestamps read back with an ordered consumer.
//     Native schedules produce their messages inside the stream only: a core
//     subscriber sees none (the run checks and says so), so native has no
//     core row. Each delayd row's native_ratio is its lateness max (its
//     last arrival after due) over the native stream row's.
//   - burst-1m (only when named in -scenarios; minutes): the burst's three
//     rows with -burst-1m-n messages (default 1,000,000), named burst-1m:
//     issue 13's "last delivered after due ≤ 0.15× native" is their
//     native_ratio. A scenario of its own, so that burst's rows and the
//     references stay at -burst-n.
//   - steady (delayd and native): each of -steady-rates msg/s (default
//     10,000 and 30,000; -steady-rate N for one) for -steady-duration,
//     each due 1 s after it is published (delayd: table "1s", level 1, to a
//     core subscriber; native: "@at publish time + 1 s" to the stream, at
//     the first rate only: no target compares with it). A row per rate,
//     the rate in its rate field. msgs_per_s is the publish rate achieved;
//     lateness = arrival − due.
//   - cancel-storm, cancel-storm-off (delayd, core): the steady workload
//     at the first steady rate (table "1s", every message with a
//     Nats-Msg-Id) run twice on fresh
//     servers, without cancels (cancel-storm-off) and with -cancel-rate
//     cancel requests per second at that level (cancel-storm): a quarter
//     unknown ids, a quarter messages delivered already, half messages
//     pending. Lateness as in steady; a message answered "cancelled" is not
//     counted lost (one answered "cancelled" and delivered is counted in
//     cancelled_and_delivered). The cancel-storm row has the answers and
//     p99_ratio, its lateness p99 over cancel-storm-off's.
//   - reschedule-storm, reschedule-storm-off (delayd, core; opt-in): the
//     cancel storm's shape with -reschedule-rate reschedule requests per
//     second (docs/pending.md §5): a quarter unknown ids, a quarter
//     messages delivered already, half pending ones, of which half moved to
//     500 ms from the request and half run now. Lateness as in steady, a
//     moved message's against its new due; the reschedule-storm row has
//     the answers, delivered_at_old and both (always 0) and p99_ratio.
//   - pending (delayd and native): -pending-n messages waiting 2 h.
//     heap_bytes_per_pending = (heap after publishing and routing − heap
//     before) / N, whole process (server included), each heap read after
//     -settle (11 s: the file store's block cache, which holds up to one
//     block of recent writes, expires after 10 s, also for the servers of
//     earlier scenarios) and two runtime.GC(). pending-own
//     (delayd): heap with the service running minus heap once it stopped:
//     delayd's own memory, which must not grow with N.
//   - cross-level (delayd, core): one server and service with the table
//     "1s 1h". A trickle of -trickle-rate msg/s to level 1 (core target)
//     runs alone for 3 s (cross-level-quiet), then from the start of
//     -burst-n messages published at full speed to level 2 until
//     DELAYD_1H holds them all (cross-level-burst, over_ref_ms: its
//     lateness minus the quiet row's). cross-level-bulk (stream):
//     msgs_per_s = N / (DELAYD_1H holding N − first publish), its early
//     counting deliveries of the burst.
//   - sustained (delayd, core; only when named in -scenarios): on one
//     server and service (table "1s"), warmed up by 2 s at the first rate,
//     each of -sustained-rates msg/s for -sustained-step, in turn, each once
//     the previous one is delivered, until one is not bounded (lateness p99
//     above 50 ms, a loss, less than 95% of the offered rate published, or
//     deliveries, distinct / (last − first arrival), below 95% of the
//     published rate; delivered_per_s). sustained-max: the highest bounded
//     step's published rate, raw_ratio over raw-publish's (measured by the
//     scenario itself when raw is not named).
//   - cluster (delayd; only when named in -scenarios): a 3-node cluster of
//     embedded servers (the options of the tests' clusters,
//     internal/natstest) with every delayd stream R3, against a 1-node
//     server with R1 streams as the reference, a fresh server or cluster
//     for every row. delayd runs as 1, 2 and 3 services, each on its own
//     in-process connection to a node of its own, without a reconnect
//     buffer (as cmd/delayd). cluster-burst: -cluster-burst-n messages
//     at level "1s" to a core target, routed by a router alone and all
//     due by T, when the services start (as in burst). cluster-steady:
//     -cluster-rate msg/s for -cluster-duration at level "1s" to a core
//     target, once the services hold every lease, balanced. Their R3 rows
//     carry r3_over_r1 (msgs_per_s, resp. lateness p99, over the R1 row's).
//     cluster-failover-kill and -graceful: 3 services, -cluster-rate msg/s
//     at level "1s" to an R3 stream target, while the service owning
//     DELAYD_1S is stopped -cluster-kills times each way, the load
//     running on: killed (its connection closed without releasing its
//     leases: what kill -9 looks like to the cluster) or stopped
//     gracefully (its context cancelled: it settles, commits and releases
//     them), and a new service started on its node at once. gap_ms is the
//     longest time between two deliveries in a row at the target after
//     each stop, up to the next (store times), over the stops; lost,
//     early and duplicates count the messages published in that phase.
//     Every service, and delaybench's own hold of DELAYD_1S's lease in
//     cluster-burst, has the lease TTL -cluster-lease-ttl (delayd's
//     default, 1.5 s). Every node, service and client shares this
//     process's cores.
//
// Every row counts lost (published and PubAcked, but never delivered, by
// payload index; a timeout counts the rest as lost) and early (delivered
// before due: arrival or store time before the due time). Times are wall
// clock where they are compared with server timestamps, and monotonic
// time.Now() deltas otherwise. Percentiles are over every message.
//
// -targets ends the run with issue 13's targets, each read from this run's
// rows (see evaluate): its figure, ratio, and met, not met, or not run
// (its rows not in the run); a Markdown table, or with -json one object
// per target ({"issue_target": …, "status": …}).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/lease"
)

// Default sizes: the whole default run stays within about 5 minutes on 2 cores.
const (
	NDefault       = 100_000
	PayloadDefault = 128
	// SteadyRatesDefault are the steady scenario's rates, msg/s: issue
	// 13's two, each with its own timer floor (ref-timer) in the run.
	SteadyRatesDefault    = "10000,30000"
	SteadyDurationDefault = 30 * time.Second
	// CancelRateDefault is the cancel storm's cancel requests per second.
	CancelRateDefault = 2_000
	// RescheduleRateDefault is the reschedule storm's requests per second.
	RescheduleRateDefault = 2_000
	BurstNDefault         = 100_000
	// BurstOneMNDefault is the burst-1m scenario's message count.
	BurstOneMNDefault = 1_000_000
	PendingNDefault   = 100_000
	// SettleDefault is how long the pending scenario waits before a heap
	// reading: past the file store's 10 s block cache expiry.
	SettleDefault = 11 * time.Second
	// ClusterBurstNDefault is the cluster scenario's burst size.
	ClusterBurstNDefault = 20_000
	// ClusterRateDefault is the cluster scenario's steady and failover
	// load, msg/s.
	ClusterRateDefault = 2_000
	// ClusterDurationDefault is how long each cluster-steady row publishes.
	ClusterDurationDefault = 10 * time.Second
	// TrickleRateDefault is the cross-level scenario's trickle, msg/s.
	TrickleRateDefault = 1_000
	// SustainedRatesDefault are the sustained scenario's rates, msg/s, in
	// the order offered.
	SustainedRatesDefault = "10000,15000,20000,25000,30000,40000,50000,60000,80000,100000"
	// SustainedStepDefault is how long the sustained scenario offers each
	// rate.
	SustainedStepDefault = 5 * time.Second
	// ClusterKillsDefault is how many times the failover rows stop the
	// level's owner, each way.
	ClusterKillsDefault = 10
)

// scenarioNames are the scenarios, in the order they run: the references
// (raw, ref) first, so that later rows can be given as ratios to them.
var scenarioNames = []string{"raw", "ref", "ingest", "burst", "burst-1m", "steady", "cancel-storm", "reschedule-storm", "pending", "cross-level", "sustained", "cluster"}

// optInScenarios run only when named in -scenarios.
var optInScenarios = []string{"burst-1m", "sustained", "cluster", "reschedule-storm"}

// defaultScenarios run when -scenarios is not given: all but the opt-in ones.
var defaultScenarios = slices.DeleteFunc(slices.Clone(scenarioNames), func(s string) bool { return slices.Contains(optInScenarios, s) })

// config is the harness's configuration; the flags set it.
type config struct {
	N               int           // raw and ingest message count
	Payload         int           // payload bytes, at least 12
	SteadyRates     []int         // steady and ref-timer: msg/s offered, one row each; cancel-storm: the first
	SteadyDuration  time.Duration // steady: publishing time
	CancelRate      int           // cancel-storm: cancel requests per second
	RescheduleRate  int           // reschedule-storm: reschedule requests per second
	CancelShare     float64       // every delayd's DELAYD_CANCEL_SHARE; 0: delayd's default
	AnswerKeep      string        // every delayd's DELAYD_ANSWER_KEEP ("off", "0" or a Go duration); "": delayd's default
	BurstN          int           // burst message count
	BurstOneMN      int           // burst-1m message count
	PendingN        int           // pending message count
	ClusterBurstN   int           // cluster-burst message count
	ClusterRate     int           // cluster-steady and cluster-failover: msg/s offered
	ClusterDur      time.Duration // cluster-steady: publishing time
	ClusterKills    int           // cluster-failover: stops of the level's owner, each way
	ClusterLeaseTTL time.Duration // cluster: every service's lease TTL, and delaybench's own hold of the level's lease
	TrickleRate     int           // cross-level: msg/s to the quiet level
	SustainedRates  []int         // sustained: msg/s offered, one step each, in order
	SustainedStep   time.Duration // sustained: how long each rate is offered
	Scenarios       []string      // subset of scenarioNames; empty = defaultScenarios
	TCP             bool          // nats-server and delayd as processes, every connection over TCP
	JSON            bool          // one JSON object per row instead of a table
	Targets         bool          // issue 13's targets, evaluated from this run's rows, at the end
	Settle          time.Duration // pending: wait before heap readings
	CommandLine     string        // printed in the header
}

// answerKeep is -answer-keep as [deliver.Config].AnswerKeep: 0 for
// delayd's default, [deliver.AnswerKeepOff] for "off" or 0.
func (c *config) answerKeep() (time.Duration, error) {
	switch c.AnswerKeep {
	case "":
		return 0, nil
	case "off":
		return deliver.AnswerKeepOff, nil
	}
	d, err := time.ParseDuration(c.AnswerKeep)
	switch {
	case err != nil || d < 0:
		return 0, fmt.Errorf(`-answer-keep %q: must be a Go duration or "off"`, c.AnswerKeep)
	case d == 0:
		return deliver.AnswerKeepOff, nil
	}
	return d, nil
}

func (c *config) validate() error {
	if c.N < 1 || c.BurstN < 1 || c.PendingN < 1 || c.SteadyDuration <= 0 || c.CancelRate < 1 {
		return errors.New("-n, -burst-n, -pending-n, -steady-duration and -cancel-rate must be positive")
	}
	if c.CancelShare < 0 || c.CancelShare > 1 {
		return errors.New("-cancel-share must be above 0 and at most 1 (0: delayd's default)")
	}
	if _, err := c.answerKeep(); err != nil {
		return err
	}
	if len(c.SteadyRates) == 0 || slices.Min(c.SteadyRates) < 1 {
		return errors.New("-steady-rates (or -steady-rate) must list positive rates")
	}
	if c.wants("burst-1m") && c.BurstOneMN < 1 {
		return errors.New("-burst-1m-n must be positive")
	}
	if c.wants("cluster") && (c.ClusterBurstN < 1 || c.ClusterRate < 1 || c.ClusterDur <= 0 || c.ClusterKills < 1 || c.ClusterLeaseTTL <= 0) {
		return errors.New("-cluster-burst-n, -cluster-rate, -cluster-duration, -cluster-kills and -cluster-lease-ttl must be positive")
	}
	if c.wants("cross-level") && c.TrickleRate < 1 {
		return errors.New("-trickle-rate must be positive")
	}
	if c.wants("sustained") && (len(c.SustainedRates) == 0 || c.SustainedStep <= 0 || slices.Min(c.SustainedRates) < 1) {
		return errors.New("-sustained-rates must list positive rates and -sustained-step be positive")
	}
	if c.Payload < idxWidth {
		return fmt.Errorf("-payload %d: must be at least %d (the index is written in the first %d bytes)", c.Payload, idxWidth, idxWidth)
	}
	for _, s := range c.Scenarios {
		if !slices.Contains(scenarioNames, s) {
			return fmt.Errorf("-scenarios: unknown scenario %q (have %s)", s, strings.Join(scenarioNames, ","))
		}
		if c.TCP && !slices.Contains(tcpScenarios, s) {
			return fmt.Errorf("-scenarios: %s has no -tcp mode (-tcp runs %s)", s, strings.Join(tcpScenarios, ","))
		}
	}
	return nil
}

func (c *config) wants(name string) bool {
	if len(c.Scenarios) == 0 {
		return slices.Contains(defaultScenarios, name) && (!c.TCP || slices.Contains(tcpScenarios, name))
	}
	return slices.Contains(c.Scenarios, name)
}

// blockProfileRate is -blockprofile's sampling rate (runtime.SetBlockProfileRate),
// 0 without it; in-process servers are started with it (their start sets
// the process's rate).
var blockProfileRate int

func main() {
	cfg := config{CommandLine: commandLine(os.Args)}
	fs := flag.NewFlagSet("delaybench", flag.ContinueOnError)
	fs.IntVar(&cfg.N, "n", NDefault, "messages for the raw and ingest scenarios")
	fs.IntVar(&cfg.Payload, "payload", PayloadDefault, "payload bytes")
	steadyRates := fs.String("steady-rates", SteadyRatesDefault, "steady and ref-timer: comma-separated rates in msg/s, a row of each per rate (native schedules: the first rate only)")
	steadyRate := fs.Int("steady-rate", 0, "steady and ref-timer: one rate in msg/s, in place of -steady-rates")
	fs.DurationVar(&cfg.SteadyDuration, "steady-duration", SteadyDurationDefault, "steady: how long to publish")
	fs.IntVar(&cfg.CancelRate, "cancel-rate", CancelRateDefault, "cancel-storm: cancel requests per second (the level takes the first steady rate for -steady-duration)")
	fs.IntVar(&cfg.RescheduleRate, "reschedule-rate", RescheduleRateDefault, "reschedule-storm: reschedule requests per second (the level takes the first steady rate for -steady-duration)")
	fs.Float64Var(&cfg.CancelShare, "cancel-share", 0, "DELAYD_CANCEL_SHARE of every delayd the run starts: the share of a core its cancel lookups may take, above 0 and at most 1 (0: delayd's default, 0.1)")
	fs.StringVar(&cfg.AnswerKeep, "answer-keep", "", `DELAYD_ANSWER_KEEP of every delayd the run starts: a Go duration, or "off" (or 0) to run without kept answers ("": delayd's default, 6h)`)
	fs.IntVar(&cfg.BurstN, "burst-n", BurstNDefault, "burst: messages all due at the same instant")
	fs.IntVar(&cfg.BurstOneMN, "burst-1m-n", BurstOneMNDefault, "burst-1m: messages all due at the same instant")
	fs.IntVar(&cfg.PendingN, "pending-n", PendingNDefault, "pending: messages waiting 2h")
	fs.IntVar(&cfg.ClusterBurstN, "cluster-burst-n", ClusterBurstNDefault, "cluster: burst messages all due at the same instant")
	fs.IntVar(&cfg.ClusterRate, "cluster-rate", ClusterRateDefault, "cluster: steady and failover load, messages per second")
	fs.DurationVar(&cfg.ClusterDur, "cluster-duration", ClusterDurationDefault, "cluster: how long each steady row publishes")
	fs.IntVar(&cfg.ClusterKills, "cluster-kills", ClusterKillsDefault, "cluster: stops of the level's owner, killed and then graceful, this many each")
	fs.DurationVar(&cfg.ClusterLeaseTTL, "cluster-lease-ttl", lease.TTLDefault, "cluster: the lease TTL of every service and of delaybench's own hold of DELAYD_1S's lease (a kill stalls the level about this long)")
	fs.IntVar(&cfg.TrickleRate, "trickle-rate", TrickleRateDefault, "cross-level: messages per second to level 1 while level 2 takes the burst (-burst-n)")
	sustainedRates := fs.String("sustained-rates", SustainedRatesDefault, "sustained: comma-separated rates in msg/s, offered in turn until one is not bounded")
	fs.DurationVar(&cfg.SustainedStep, "sustained-step", SustainedStepDefault, "sustained: how long each rate is offered")
	scen := fs.String("scenarios", strings.Join(defaultScenarios, ","), "comma-separated subset of "+strings.Join(scenarioNames, ",")+" (burst-1m, sustained and cluster only when named)")
	fs.BoolVar(&cfg.TCP, "tcp", false, "run nats-server and delayd as processes (built with go build), every connection over TCP on loopback")
	fs.BoolVar(&cfg.JSON, "json", false, "one JSON object per row instead of a table")
	fs.BoolVar(&cfg.Targets, "targets", false, "at the end, issue 13's targets evaluated from this run's rows: figure, ratio, met, not met or not run (-json: one object per target)")
	fs.DurationVar(&cfg.Settle, "settle", SettleDefault, "pending: wait before each heap reading (the file store's block cache expires after 10s)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	memProfile := fs.String("memprofile", "", "write an allocation profile at the end to this file (go tool pprof -sample_index=alloc_space)")
	blockProfile := fs.String("blockprofile", "", "write a profile of the time goroutines spent blocked (channels, selects, sync waits; sampled: one event per 10µs blocked, which still slows a saturated run) at the end to this file")
	mutexProfile := fs.String("mutexprofile", "", "write a profile of mutex contention (one contended unlock in 100 sampled) at the end to this file")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	for _, p := range []struct{ file, name string }{{*blockProfile, "block"}, {*mutexProfile, "mutex"}} {
		if p.file == "" {
			continue
		}
		if p.name == "block" {
			blockProfileRate = int(10 * time.Microsecond)
			runtime.SetBlockProfileRate(blockProfileRate)
		} else {
			runtime.SetMutexProfileFraction(100)
		}
		defer func() {
			if f, err := os.Create(p.file); err == nil {
				_ = pprof.Lookup(p.name).WriteTo(f, 0)
				_ = f.Close()
			}
		}()
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "delaybench:", err)
			os.Exit(2)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "delaybench:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		defer func() {
			if f, err := os.Create(*memProfile); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(f, 0)
				_ = f.Close()
			}
		}()
	}
	var err error
	if cfg.SustainedRates, err = parseRates("-sustained-rates", *sustainedRates); err != nil {
		fmt.Fprintln(os.Stderr, "delaybench:", err)
		os.Exit(2)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case set["steady-rate"] && set["steady-rates"]:
		fmt.Fprintln(os.Stderr, "delaybench: give -steady-rate or -steady-rates, not both")
		os.Exit(2)
	case set["steady-rate"]:
		cfg.SteadyRates = []int{*steadyRate}
	default:
		if cfg.SteadyRates, err = parseRates("-steady-rates", *steadyRates); err != nil {
			fmt.Fprintln(os.Stderr, "delaybench:", err)
			os.Exit(2)
		}
	}
	for s := range strings.SplitSeq(*scen, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.Scenarios = append(cfg.Scenarios, s)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "delaybench:", err)
		stop()
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// parseRates reads a comma-separated list of rates in msg/s given to the
// flag name; it checks only that each is an integer (validate checks the
// rest).
func parseRates(name, list string) ([]int, error) {
	var rates []int
	for s := range strings.SplitSeq(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		r, err := strconv.Atoi(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not a rate in msg/s", name, s)
		}
		rates = append(rates, r)
	}
	return rates, nil
}

// commandLine is the command as typed: under go run, os.Args[0] is a
// temporary binary, shown as "go run ./cmd/delaybench".
func commandLine(args []string) string {
	cmd := args[0]
	if strings.Contains(cmd, "go-build") {
		cmd = "go run ./cmd/delaybench"
	}
	return strings.Join(append([]string{cmd}, args[1:]...), " ")
}

// run runs the selected scenarios and writes the rows to stdout (a table, or
// JSON lines) and progress to stderr.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	root, err := os.MkdirTemp("", "delaybench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)

	b := &bench{cfg: cfg, root: root, stderr: stderr}
	out := newOutput(cfg, stdout)
	out.header()
	start := time.Now()
	for _, name := range scenarioNames {
		if !cfg.wants(name) {
			continue
		}
		b.logf("%s: start", name)
		s := time.Now()
		rows, notes, err := b.scenario(ctx, name)
		for _, r := range rows {
			out.row(r)
		}
		for _, n := range notes {
			out.note(n)
		}
		if err != nil {
			out.footer(time.Since(start))
			return fmt.Errorf("%s: %w", name, err)
		}
		b.logf("%s: done in %s", name, time.Since(s).Round(time.Millisecond))
	}
	out.footer(time.Since(start))
	return nil
}

func (b *bench) scenario(ctx context.Context, name string) ([]result, []string, error) {
	switch name {
	case "raw":
		return b.raw(ctx)
	case "ref":
		return b.ref(ctx)
	case "ingest":
		return b.ingest(ctx)
	case "burst":
		return b.burst(ctx, "burst", b.cfg.BurstN)
	case "burst-1m":
		return b.burst(ctx, "burst-1m", b.cfg.BurstOneMN)
	case "steady":
		return b.steady(ctx)
	case "cancel-storm":
		return b.cancelStorm(ctx)
	case "reschedule-storm":
		return b.rescheduleStorm(ctx)
	case "pending":
		return b.pending(ctx)
	case "cross-level":
		return b.crossLevel(ctx)
	case "sustained":
		return b.sustained(ctx)
	case "cluster":
		return b.cluster(ctx)
	}
	return nil, nil, fmt.Errorf("unknown scenario %q", name)
}

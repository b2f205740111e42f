package deliver

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/cancelapi"
	"github.com/delayd/delayd/deliver/internal/ownership"
	"github.com/delayd/delayd/deliver/internal/routing"
	"github.com/delayd/delayd/deliver/internal/supervise"
	"github.com/delayd/delayd/deliver/internal/target"
	"github.com/delayd/delayd/levels"
)

// Stream names and defaults of the JetStream resources delayd creates.
const (
	// IngressStream is the work-queue stream publishers write to, on "<prefix>.>".
	IngressStream = "DELAYD_INGRESS"

	// DuplicateWindowDefault is the ingress and dead-letter streams'
	// Nats-Msg-Id duplicate window (JetStream's own default),
	// [contract.DuplicateWindow].
	DuplicateWindowDefault = contract.DuplicateWindow

	publishAsyncTimeout = 10 * time.Second
)

// Config configures a [Service].
type Config struct {
	// Prefix is the ingress subject prefix: publishers write to
	// "<Prefix>.<target>". Optional. Default [contract.PrefixDefault]
	// ("delay").
	Prefix string

	// Levels is the level table. Optional. Default [levels.Default] (the 18
	// levels 1s ... 2h of RocketMQ 4).
	Levels levels.Table

	// Partitions splits levels of Levels into partition streams
	// ("DELAYD_1M-P0" ...); the router puts a message in partition
	// [levels.PartitionOf] (its Delay-Partition-Key, else its target
	// subject). It must name only levels of Levels. Optional. Default:
	// no level partitioned.
	Partitions levels.Partitions

	// IngressPartitions is the number of ingress partitions N, 1 to
	// [levels.PartitionsMax] (DELAYD_INGRESS_PARTITIONS). Above 1,
	// DELAYD_INGRESS stores each "<Prefix>.<target>" under
	// "delayd.in.<i>.<target>", i = FNV-1a 32 of the published subject mod
	// N (the server's subject transform partition(N)), and N routers run,
	// each under its own lease "router.<i>", each writing only its share of
	// every level's partitions: every level has a multiple of N partitions
	// (N where Partitions gives it none; another count is an error), and
	// partition j is written by router j mod N. A change of N is refused
	// while DELAYD_INGRESS holds messages ([ErrIngressPartitionsChanged]).
	// Optional. Default 1: one router, lease "router", subjects stored as
	// published.
	IngressPartitions int

	// Targets is the operator's allow and deny lists of target subject
	// patterns; deny wins. Optional. Default allows every valid target.
	Targets contract.TargetPolicy

	// MaxDelay is the longest Delay-Duration or Delay-Deliver-At accepted.
	// Optional. Default [contract.MaxDelayDefault].
	MaxDelay time.Duration

	// CancelLookupShare is the share of one core's time, in (0, 1], the
	// cancel API's id-index lookups may take: one lookup at a time, and
	// after a lookup that took d, none for d×(1/share − 1). Lookups cost
	// the NATS server a walk of the index (docs/guarantees.md#what-a-cancel-costs),
	// so this trades cancel capacity against delivery lateness; requests
	// beyond what it allows are answered busy ([ErrCancelBusy]). Optional.
	// Default [CancelLookupShareDefault].
	CancelLookupShare float64

	// Replicas for every stream delayd creates. Optional. Default 1.
	Replicas int

	// LookupConn is a second connection to the same NATS server and
	// account, used only for reads of the id index: the cancel API's
	// lookups (direct gets on DELAYD_INDEX) with the direct gets of level
	// messages that decide a cancel, and the router's merge checks that
	// miss its merge cache. A lookup walks the whole index on the server
	// (docs/guarantees.md#what-a-cancel-costs), and nats-server answers a client's
	// direct gets inline, on the read loop of that client's connection:
	// on the service's own connection every delivery, level write and
	// ack sent behind a lookup waits until its walk is done. Optional: nil
	// reads on the service's connection (cmd/delayd always passes one,
	// named "delayd-lookups"). The service does not close it.
	LookupConn *nats.Conn

	// StartGrace holds back overdue deliveries to core subjects for this long
	// after a reconnect ([Service.HandleReconnect]) and, with GraceAtStart,
	// after start: core subscribers reconnect meanwhile. Optional. Default 0.
	StartGrace time.Duration

	// GraceAtStart applies StartGrace at start too: in embedded mode a
	// restart of delayd restarts the server its subscribers use.
	GraceAtStart bool

	// IndexKeep is how long the id index keeps the records of a message
	// after it left its level (delivered or cancelled): a cancel that late
	// still answers "already delivered" or "cancelled", a later one "not
	// found". Optional. Default [IndexKeep].
	IndexKeep time.Duration

	// AnswerKeep is how long a message's final answer ("already
	// delivered" or "cancelled") is kept once the id index has trimmed its
	// records (stream DELAYD_ANSWERS): cancel and status answer truly for
	// about IndexKeep plus AnswerKeep after the message left its level,
	// "not found" after. Between [AnswerKeepMin] and [AnswerKeepMax], or
	// [AnswerKeepOff]. Optional. Default [AnswerKeepDefault].
	AnswerKeep time.Duration

	// AnswerMaxBytes bounds DELAYD_ANSWERS on disk: past it, the oldest
	// answers are dropped first (they answer "not found" before
	// AnswerKeep). Pending messages keep their records in the id index,
	// which this never touches. At least [AnswerMaxBytesMin]. Optional.
	// Default [AnswerMaxBytesDefault].
	AnswerMaxBytes int64

	// LeaseTTL is the TTL, T, of the leases through which the router and
	// each level stream's scanner are owned by one delayd process at a
	// time (bucket DELAYD_LEASES): an owner that stops renewing (a crash)
	// is replaced T after its last renewal, and a process started after a
	// crash takes its dead predecessor's leases T after it first reads
	// them. A graceful stop releases them: the next process takes them at
	// once. Optional. Default lease.TTLDefault (1.5 s).
	LeaseTTL time.Duration

	// Logger is optional. Default discards.
	Logger *slog.Logger

	// Clock is the scanners' local clock. Optional. Default [SystemClock].
	// Due times are server times (store time + delay): due-ness is decided
	// by an estimate of the server's clock (server timestamps plus
	// monotonic time elapsed since), never by Clock.Now. Tests inject a
	// clock whose wall reading is skewed or steps.
	Clock Clock

	// OnDelivery is called for every delivery with its level stream and
	// lateness, on the scanner's goroutine (a metrics histogram). Optional.
	OnDelivery func(stream string, lateness time.Duration)

	// Router and Scanner tune the routers and every scanner. Of Router
	// only MaxInFlight and Batch count: the service fills in the rest from
	// this Config. Optional.
	Router  RouterConfig
	Scanner ScannerConfig
}

// Service is delayd's main job: it creates the JetStream resources, routes
// ingress into level streams and runs one scanner per level stream,
// including level streams that are no longer in the table but still hold
// messages.
//
// Several Services (delayd processes, replicas) may run on one account:
// the router, each level stream's scanner and the singleton jobs (the id
// index trim) run only in the Service that holds their lease (key
// "router", "level." + the stream name, and "janitor", in DELAYD_LEASES),
// one [ownership.Elector] each. The Services share the leases: each bids
// only while it holds fewer than its share, ceil(leases / live Services),
// and hands a surplus over (docs/operations.md#several-replicas). A Service holding
// no lease is ready; a graceful stop settles, commits and releases every
// lease it holds, so other Services take over at once. A Service whose
// level table, prefix or replica count differs from a live one's refuses
// to start ([ErrReplicaMismatch]).
type Service struct {
	nc     *nats.Conn
	cfg    Config
	logger *slog.Logger

	targets *target.Bindings

	dead deadLetters

	// mu guards parts.routers, parts.levels, own.leases and own.holder,
	// which Run sets together under it.
	mu    sync.Mutex
	parts serviceParts
	ready atomic.Bool

	// partitionsSetting is DELAYD_PARTITIONS as given (cfg.Partitions
	// carries the ingress partitions too), for the shared settings.
	partitionsSetting string

	answers serviceAnswers
	own     serviceLeases
	hooks   testHooks // tests only; set before Run
}

// New returns a service on nc. Nothing touches the server until Run.
func New(nc *nats.Conn, cfg Config) (*Service, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	cfg.Prefix = cmp.Or(cfg.Prefix, contract.PrefixDefault)
	if cfg.Levels.Len() == 0 {
		cfg.Levels = levels.Default()
	}
	if cfg.CancelLookupShare == 0 {
		cfg.CancelLookupShare = CancelLookupShareDefault
	}
	cfg.IngressPartitions = max(cfg.IngressPartitions, 1)
	if cfg.IngressPartitions > levels.PartitionsMax {
		return nil, fmt.Errorf("deliver: ingress partitions %d: must be between 1 and %d", cfg.IngressPartitions, levels.PartitionsMax)
	}
	setting := cfg.Partitions.String()
	cfg.Partitions = cfg.Partitions.WithIngress(cfg.IngressPartitions)
	if err := cfg.Partitions.Check(cfg.Levels); err != nil {
		return nil, fmt.Errorf("deliver: %w", err)
	}
	if !(cfg.CancelLookupShare > 0 && cfg.CancelLookupShare <= 1) {
		return nil, fmt.Errorf("deliver: cancel lookup share %v: must be above 0 and at most 1", cfg.CancelLookupShare)
	}
	if cfg.Replicas < 1 {
		return nil, fmt.Errorf("deliver: replicas %d: must be at least 1", cfg.Replicas)
	}
	cfg.AnswerKeep = cmp.Or(cfg.AnswerKeep, AnswerKeepDefault)
	if cfg.AnswerKeep != AnswerKeepOff && (cfg.AnswerKeep < AnswerKeepMin || cfg.AnswerKeep > AnswerKeepMax) {
		return nil, fmt.Errorf("deliver: answer keep %s: must be from %s to %s, or AnswerKeepOff", cfg.AnswerKeep, AnswerKeepMin, AnswerKeepMax)
	}
	cfg.AnswerMaxBytes = cmp.Or(cfg.AnswerMaxBytes, AnswerMaxBytesDefault)
	if cfg.AnswerMaxBytes < AnswerMaxBytesMin {
		return nil, fmt.Errorf("deliver: answer max bytes %d: must be at least %d", cfg.AnswerMaxBytes, int64(AnswerMaxBytesMin))
	}
	if cfg.LeaseTTL < 0 {
		return nil, fmt.Errorf("deliver: lease TTL %s: must not be negative", cfg.LeaseTTL)
	}
	if err := cfg.Targets.Validate(); err != nil {
		return nil, fmt.Errorf("deliver: target policy: %w", err)
	}
	return &Service{nc: nc, cfg: cfg, logger: cfg.Logger, targets: target.New(nc, mustJS(nc, 0), cfg.Logger), partitionsSetting: setting,
		answers: serviceAnswers{work: answerWork{bounds: answerBounds{passMax: answerPassMax, lagMax: answerLagMax, rangeMax: answerRangeMax}}}}, nil
}

// Ready reports whether the resources exist and the service bids for its
// leases (the router and each scanner run while it holds theirs; holding
// none is ready), the connection is up, the router is healthy, no scanner is
// stalled (a due head not handed off for [ScannerStallAfterDefault]) and
// DELAYD_DLQ has not refused a dead letter for that long. [Service.Unready]
// says why not.
func (s *Service) Ready() bool { return len(s.Unready()) == 0 }

// Unready returns why the service is not ready, one reason each, naming the
// level stream or DELAYD_DLQ at fault; nil when ready.
func (s *Service) Unready() []string {
	if !s.ready.Load() {
		return []string{"starting: resources not set up yet"}
	}
	var why []string
	if !s.nc.IsConnected() {
		why = append(why, "NATS connection down")
	}
	s.mu.Lock()
	for _, router := range s.parts.routers {
		if r := router.Unhealthy(); r != "" {
			why = append(why, r)
		}
	}
	s.mu.Unlock()
	if st := s.Stalled(); len(st) > 0 {
		why = append(why, "stalled levels "+strings.Join(st, " "))
	}
	if d := s.dead.refused.Snapshot(); d.Waiting > 0 && d.Oldest > ScannerStallAfterDefault {
		why = append(why, fmt.Sprintf("%s refuses dead letters: %d waiting, the oldest for %s: %v", DLQStream, d.Waiting, d.Oldest.Round(time.Second), d.LastErr))
	}
	return why
}

// DLQRefusals returns the state of dead letters DELAYD_DLQ refuses: failed
// writes since start, and those waiting to be stored.
func (s *Service) DLQRefusals() DLQRefusals { return DLQRefusals(s.dead.refused.Snapshot()) }

// HandleReconnect tells the service its connection came back (wire it into
// nats.ReconnectHandler): deliveries to core subjects that fell due during
// the outage wait StartGrace, so that core subscribers reconnect first.
func (s *Service) HandleReconnect() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.parts.levels {
		l.Reconnected()
	}
}

// DeadLetters returns the dead letters written since start, by reason
// (every reason of [Reasons] is present).
func (s *Service) DeadLetters() map[string]uint64 { return s.dead.reasons.Snapshot() }

// HandleAsyncError takes the connection's asynchronous errors (wire it into
// nats.ErrorHandler). A publish permissions violation marks its subject as
// refused, so that deliveries there are retried and then dead-lettered
// instead of counted as delivered. Safe before Run and for concurrent use.
func (s *Service) HandleAsyncError(err error) {
	s.targets.NoteError(err)
}

// Stalled returns the level streams whose scanner is stalled.
func (s *Service) Stalled() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name, l := range s.parts.levels {
		if l.Stalled() {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Run sets up the resources (retrying until the server answers), then
// routes and delivers until ctx is done. It returns nil after a clean
// shutdown: the router stopped taking ingress, the scanners confirmed what
// was in flight and committed their offsets. A hop secret in the offsets
// bucket that delayd did not write stops it at once with an error wrapping
// [ErrHopKey].
func (s *Service) Run(ctx context.Context) error {
	own := ownership.NewService(ownership.ServiceConfig{TTL: s.cfg.LeaseTTL, OnEvent: s.own.event, Logger: s.logger})
	defer own.Leave() // the membership key deleted (bounded: 5 s)
	if ok, err := s.joinUntilOK(ctx, own); !ok {
		return err
	}
	st, err := s.setupUntilOK(ctx, own)
	if st == nil {
		return err
	}
	if err := s.targets.Refresh(ctx); err != nil {
		s.logger.Warn("target index refresh failed", slog.Any("error", err))
	}
	p, err := s.build(own, st)
	if err != nil {
		return err
	}
	if err := p.cancels.Subscribe(ctx); err != nil {
		return err
	}
	// The info API is not in the group: it answers from before ready (its
	// subscription confirmed) until the group has stopped, so a stopping
	// delayd still answers `delayctl info` through its drain (the group's
	// context ends at the drain's start).
	info, err := s.subscribeInfo(ctx)
	if err != nil {
		p.cancels.Unsubscribe()
		return err
	}
	g := supervise.New(ctx, s.logger)
	g.Go("targets", supervise.Func(s.targets.Run))
	g.Go("lease log", supervise.Func(s.own.gains.run))
	g.Go("ownership", own.Plan(p.plan))
	g.Go("cancel API", p.cancels)
	own.Bidding() // the others count this replica in their shares from now on
	s.ready.Store(true)
	s.logger.Info("delayd scheduling", slog.String("ingress", s.cfg.Prefix+".>"), slog.Int("level_streams", len(st.streams)), slog.String("holder", own.Holder()))

	err = g.Wait()
	s.ready.Store(false)
	_ = info.Unsubscribe()
	return err
}

// built is what [Service.build] made for Run: values only, nothing runs
// yet.
type built struct {
	plan    ownership.Plan // every lease's elector, in the order they start
	cancels *cancelapi.API // the cancel and status APIs, not subscribed yet
}

// build makes Run's parts from what setup made, values only (no goroutine,
// no subscription): the routers' merge caches, the levels, the routers
// (with their level owners), the lease plan with the janitor, and the
// cancel API (with its own level owners). It publishes them for the
// Service's readers (s.parts and s.own, the routers and levels under s.mu).
func (s *Service) build(own *ownership.Service, st *setupState) (built, error) {
	merges := routing.NewMergeCaches(s.cfg.IngressPartitions) // the routers' merge caches, where the scanners forget
	// The levels' movers wait on the cancel API's routed wait; the API is
	// built below, once the levels are (it asks their owners), and set
	// before anything runs.
	var cancels *cancelapi.API
	routed := func(ctx context.Context) (bool, error) { return cancels.Routed(ctx) }
	lvls, err := s.buildLevels(st.streams, st.store, s.targets, merges, routed)
	if err != nil {
		return built{}, err
	}
	routers, err := s.buildRouters(lvls, st.store, merges)
	if err != nil {
		return built{}, err
	}
	plan, err := s.leasePlan(own, st, lvls, routers)
	if err != nil {
		return built{}, err
	}
	cancels = s.newCancelAPI(mustJS(s.nc, 0))
	s.parts.cancelAPI = cancels
	return built{plan: plan, cancels: cancels}, nil
}

// leasePlan makes one elector per lease, values only (no goroutine): the
// router's (one per ingress partition), each level stream's and the
// janitor's, sharing the leases with the other live replicas through
// own's balancer, except those hooks.noBid names. It publishes them
// (s.own, and s.parts with routers and scanners under s.mu) and returns
// the order they start in: the routers after every level's and the
// janitor's first bid ([ownership.Plan]).
func (s *Service) leasePlan(own *ownership.Service, st *setupState, lvls levelSet, routers []*routing.Router) (ownership.Plan, error) {
	var plan ownership.Plan
	if err := own.Open(st.bucket); err != nil {
		return plan, err
	}
	leases := make(map[string]*leaseState, len(lvls)+2)
	s.own.onLease = s.hooks.onLease
	s.own.gains = newGainLog(s.logger.With(slog.String("component", "lease")), func() int {
		n := 0
		for _, st := range leases {
			if _, held := st.elector.Held(); held {
				n++
			}
		}
		return n
	})
	addLease := func(to *[]ownership.Lease, key string, work ownership.Work) error {
		if s.hooks.noBid != nil && s.hooks.noBid(key) {
			return nil
		}
		l, err := own.Lease(key, work)
		if err != nil {
			return err
		}
		leases[key] = &leaseState{elector: l.Elector()}
		*to = append(*to, l)
		return nil
	}
	for _, router := range routers {
		if err := addLease(&plan.Then, router.LeaseKey(), router.RunTerm); err != nil {
			return plan, err
		}
	}
	for _, name := range st.streams {
		if err := addLease(&plan.First, ownership.LevelKey(name), lvls[name].RunTerm); err != nil {
			return plan, err
		}
	}
	// The singleton jobs run in one replica at a time.
	if err := addLease(&plan.First, ownership.JanitorKey, s.newJanitor(st.store, own.Members(), lvls).RunTerm); err != nil {
		return plan, err
	}
	s.own.balancer.Store(own.Balancer())
	s.mu.Lock()
	s.parts.routers, s.parts.levels, s.own.leases, s.own.holder = routers, lvls, leases, own.Holder()
	s.mu.Unlock()
	return plan, nil
}

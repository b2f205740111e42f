package deliver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/leadership"
	"github.com/delayd/delayd/internal/lease"
	"github.com/delayd/delayd/levels"
	"github.com/delayd/delayd/offsets"
)

// Stream names and defaults of the JetStream resources delayd creates.
const (
	// IngressStream is the work-queue stream publishers write to, on "<prefix>.>".
	IngressStream = "DELAYD_INGRESS"

	// DuplicateWindowDefault is the ingress and dead-letter streams'
	// Nats-Msg-Id duplicate window (JetStream's own default).
	DuplicateWindowDefault = 2 * time.Minute

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
	// the NATS server a walk of the index (README "What a cancel costs"),
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
	// (README "What a cancel costs"), and nats-server answers a client's
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

	// Clock is the scanners' local clock ([ScannerConfig].Clock). Optional.
	// Default [SystemClock]. Due-ness is decided by an estimate of the
	// server's clock, never by Clock.Now.
	Clock Clock

	// OnDelivery is called for every delivery with its level stream and
	// lateness, on the scanner's goroutine (a metrics histogram). Optional.
	OnDelivery func(stream string, lateness time.Duration)

	// Router and Scanner tune the router and every scanner; their required
	// fields are filled in by the service. Optional.
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
// one [leadership.Elector] each. The Services share the leases: each bids
// only while it holds fewer than its share, ceil(leases / live Services),
// and hands a surplus over (README "Several replicas"). A Service holding
// no lease is ready; a graceful stop settles, commits and releases every
// lease it holds, so other Services take over at once. A Service whose
// level table, prefix or replica count differs from a live one's refuses
// to start ([ErrReplicaMismatch]).
type Service struct {
	nc     *nats.Conn
	cfg    Config
	logger *slog.Logger

	targets *TargetIndex

	reasons reasonCounts
	refused dlqRefusals // dead letters DELAYD_DLQ refused, not stored yet

	mu       sync.Mutex
	routers  []*Router // by ingress partition
	scanners map[string]*Scanner
	ready    atomic.Bool

	// partitionsSetting is DELAYD_PARTITIONS as given (cfg.Partitions
	// carries the ingress partitions too), for the shared settings.
	partitionsSetting string

	cancelCancelled, cancelNotFound, cancelDelivered, cancelBusy atomic.Uint64

	hopKey hopKey // set by setup
	// boundaries are, by level delay, the boundaries of its streams at
	// the last change of its partition count, while old messages may be
	// pending (README "Partitions for hot levels"); set by setup.
	boundaries map[time.Duration]map[string]uint64
	routed     *routedGate // shared by the cancel workers; set by Run
	lookups    *lookupGate // paces the cancel workers' index lookups

	// leases are the electors' counters by lease key, filled by Run before
	// the electors start and read-only after; onLease, if set (tests),
	// sees every elector's events, on the elector's goroutine.
	leases  map[string]*leaseState
	onLease func(leadership.Event)

	balancer   atomic.Pointer[leadership.Balancer] // set by Run
	trimPasses atomic.Uint64                       // id index trim passes run (tests)

	// holder is this Service's lease holder id, set by Run. noBid, if set
	// (tests), names lease keys this Service does not bid for, to pin
	// ownership on another replica.
	holder string
	noBid  func(key string) bool

	// ingressChanging, if set (tests), runs in setup between the check
	// that DELAYD_INGRESS is empty and the update of its transform at a
	// change of the ingress partition count.
	ingressChanging func()
}

// leaseState is one lease's state in this Service, for [Service.Leases].
type leaseState struct {
	elector           *leadership.Elector
	gained, failovers atomic.Uint64
}

// LeaseStats is this Service's view of one lease.
type LeaseStats struct {
	// Key is the lease key: "router", or "level." + a level stream's name.
	Key string
	// Held reports whether this Service holds the lease now.
	Held bool
	// Epoch is the epoch of this Service's last term of the lease; 0 if it
	// never held it.
	Epoch uint64
	// Gained counts the terms this Service gained since start.
	Gained uint64
	// Failovers counts this Service's terms that ended without its
	// resigning: expired (no renewal stored in time), lost to another
	// holder, or given up when the work stopped (fenced). Each one hands
	// the work to another replica after the TTL, not at once.
	Failovers uint64
}

// Leases returns this Service's view of every lease it bids for, sorted by
// key; empty until Run has set up.
func (s *Service) Leases() []LeaseStats {
	s.mu.Lock()
	leases := s.leases
	s.mu.Unlock()
	out := make([]LeaseStats, 0, len(leases))
	for key, st := range leases {
		epoch, held := st.elector.Held()
		out = append(out, LeaseStats{Key: key, Held: held, Epoch: epoch, Gained: st.gained.Load(), Failovers: st.failovers.Load()})
	}
	slices.SortFunc(out, func(a, b LeaseStats) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Balance returns how many replicas are live (this one included, as
// counted from their membership keys in DELAYD_LEASES), this replica's
// share of the leases (ceil(leases / live)) and how many it holds; zeros
// until Run has set up.
func (s *Service) Balance() (live, share, held int) {
	if b := s.balancer.Load(); b != nil {
		return b.Share()
	}
	return 0, 0, 0
}

// leaseEvent counts an elector's event; it runs on the elector's goroutine.
func (s *Service) leaseEvent(ev leadership.Event) {
	if st := s.leases[ev.Key]; st != nil {
		switch ev.Kind {
		case leadership.Gained:
			st.gained.Add(1)
		case leadership.Lost:
			st.failovers.Add(1)
		}
	}
	if s.onLease != nil {
		s.onLease(ev)
	}
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
	if cfg.LeaseTTL < 0 {
		return nil, fmt.Errorf("deliver: lease TTL %s: must not be negative", cfg.LeaseTTL)
	}
	if err := cfg.Targets.Validate(); err != nil {
		return nil, fmt.Errorf("deliver: target policy: %w", err)
	}
	return &Service{nc: nc, cfg: cfg, logger: cfg.Logger, targets: NewTargetIndex(nc, mustJS(nc, 0), cfg.Logger), partitionsSetting: setting}, nil
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
	for _, router := range s.routers {
		if r := router.Unhealthy(); r != "" {
			why = append(why, r)
		}
	}
	s.mu.Unlock()
	if st := s.Stalled(); len(st) > 0 {
		why = append(why, "stalled levels "+strings.Join(st, " "))
	}
	if d := s.refused.snapshot(); d.Waiting > 0 && d.Oldest > ScannerStallAfterDefault {
		why = append(why, fmt.Sprintf("%s refuses dead letters: %d waiting, the oldest for %s: %v", DLQStream, d.Waiting, d.Oldest.Round(time.Second), d.LastErr))
	}
	return why
}

// DLQRefusals returns the state of dead letters DELAYD_DLQ refuses: failed
// writes since start, and those waiting to be stored.
func (s *Service) DLQRefusals() DLQRefusals { return s.refused.snapshot() }

// HandleReconnect tells the service its connection came back (wire it into
// nats.ReconnectHandler): deliveries to core subjects that fell due during
// the outage wait StartGrace, so that core subscribers reconnect first.
func (s *Service) HandleReconnect() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sc := range s.scanners {
		sc.Reconnected()
	}
}

// DeadLetters returns the dead letters written since start, by reason
// (every reason of [Reasons] is present).
func (s *Service) DeadLetters() map[string]uint64 { return s.reasons.snapshot() }

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
	for name, sc := range s.scanners {
		if sc.Stalled() {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Stats returns the router's counters and each scanner's, by stream name.
// With ingress partitions the router's are the sum over this replica's
// routers (Owner if it routes any partition, Epoch the highest, no
// IngressPartition or Lease); [Service.RouterStats] gives each one's.
func (s *Service) Stats() (RouterStats, []ScannerStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rs RouterStats
	switch len(s.routers) {
	case 0:
	case 1:
		rs = s.routers[0].Stats()
	default:
		for _, r := range s.routers {
			st := r.Stats()
			rs.Routed += st.Routed
			rs.DeadLettered += st.DeadLettered
			rs.Clamped += st.Clamped
			rs.Skipped += st.Skipped
			rs.Merged += st.Merged
			rs.IndexErrors += st.IndexErrors
			rs.Owner = rs.Owner || st.Owner
			rs.Epoch = max(rs.Epoch, st.Epoch)
			for stream, n := range st.FencedWrites {
				if rs.FencedWrites == nil {
					rs.FencedWrites = make(map[string]uint64)
				}
				rs.FencedWrites[stream] += n
			}
		}
	}
	var ss []ScannerStats
	for _, sc := range s.scanners {
		ss = append(ss, sc.Stats())
	}
	slices.SortFunc(ss, func(a, b ScannerStats) int { return strings.Compare(a.Stream, b.Stream) })
	return rs, ss
}

// RouterStats returns each router's counters in this replica, by ingress
// partition: one entry when ingress is not partitioned; nil until Run has
// set up.
func (s *Service) RouterStats() []RouterStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]RouterStats, 0, len(s.routers))
	for _, r := range s.routers {
		out = append(out, r.Stats())
	}
	return out
}

// Run sets up the resources (retrying until the server answers), then
// routes and delivers until ctx is done. It returns nil after a clean
// shutdown: the router stopped taking ingress, the scanners confirmed what
// was in flight and committed their offsets. A hop secret in the offsets
// bucket that delayd did not write stops it at once with an error wrapping
// [ErrHopKey].
func (s *Service) Run(ctx context.Context) error {
	// Join the replicas before touching any stream: a replica whose level
	// table differs from a live one's must change nothing.
	holder := lease.NewHolderID()
	mctx, leave := context.WithCancel(ctx)
	var members *lease.Membership
	defer func() {
		leave()
		if members != nil {
			<-members.Done() // the membership key deleted (bounded: 5 s)
		}
	}()
	backoff := newBackoff(200*time.Millisecond, 5*time.Second)
	for {
		var err error
		members, err = s.join(mctx, holder)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, lease.ErrMismatch) {
			return fmt.Errorf("%w: %w", ErrReplicaMismatch, err)
		}
		if err := s.permanent(err); err != nil {
			return err
		}
		s.logger.Warn("joining the replicas failed; retrying", slog.Any("error", err))
		if !backoff.sleep(ctx) {
			return nil
		}
	}

	var streams []string
	var store *offsets.Store
	var bucket *lease.Bucket
	backoff.reset()
	for {
		var err error
		streams, store, bucket, err = s.setupInTurn(ctx, holder)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrHopKey) || errors.Is(err, ErrIngressPartitionsChanged) {
			return err // retrying cannot help: an operator must act
		}
		if err := s.permanent(err); err != nil {
			return err
		}
		s.logger.Warn("setup failed; retrying", slog.Any("error", err))
		if !backoff.sleep(ctx) {
			return nil
		}
	}

	targets := s.targets
	if err := targets.Refresh(ctx); err != nil {
		s.logger.Warn("target index refresh failed", slog.Any("error", err))
	}

	start := time.Now()
	var routersRef atomic.Pointer[[]*Router] // for the scanners' mergeGone, set below
	scanners := make(map[string]*Scanner, len(streams))
	for _, name := range streams {
		sc := s.cfg.Scanner
		sc.Stream, sc.Offsets, sc.Targets, sc.Prefix = name, store, targets, s.cfg.Prefix
		if s.cfg.OnDelivery != nil {
			stream := name
			sc.OnDelivery = func(l time.Duration) { s.cfg.OnDelivery(stream, l) }
		}
		sc.Logger = s.logger.With(slog.String("component", "scanner"))
		if s.cfg.Clock != nil {
			sc.Clock = s.cfg.Clock
		}
		sc.StartGrace = s.cfg.StartGrace
		if s.cfg.GraceAtStart {
			sc.StartedAt = start
		}
		window := sc.Window
		if window == 0 {
			window = ScannerWindowDefault
		}
		var gate *orderGate
		if d, ok := levels.ParseStreamName(name); ok && s.boundaries[d] != nil {
			gate = newOrderGate(name, s.boundaries[d], store, mustJS(s.nc, 0))
		}
		scanner, err := newScanner(s.nc, mustJS(s.nc, window+16), sc, scannerWiring{
			reasons: &s.reasons, refused: &s.refused, hopKey: s.hopKey, fenced: true, gate: gate,
			mergeGone: func(rec index.Record) {
				if rs := routersRef.Load(); rs != nil {
					for _, r := range *rs {
						r.forgetMerge(rec)
					}
				}
			},
		})
		if err != nil {
			return err
		}
		scanners[name] = scanner
	}
	rc := s.cfg.Router
	rc.Prefix, rc.Levels, rc.Targets, rc.Replicas, rc.MaxDelay = s.cfg.Prefix, s.cfg.Levels, s.cfg.Targets, s.cfg.Replicas, s.cfg.MaxDelay
	rc.Partitions = s.cfg.Partitions
	rc.OnRouted = func(stream string, seq uint64) {
		if sc := scanners[stream]; sc != nil {
			sc.Written(seq)
		}
	}
	inflight := rc.MaxInFlight
	if inflight == 0 {
		inflight = RouterMaxInFlightDefault
	}
	// One router per ingress partition (README "Ingress partitions").
	routers := make([]*Router, s.cfg.IngressPartitions)
	owners := newPendingAsker(s.nc)
	for i := range routers {
		rc := rc
		rc.IngressPartition = i
		rc.Logger = s.logger.With(slog.String("component", "router"))
		if len(routers) > 1 {
			rc.Logger = rc.Logger.With(slog.Int("ingress_partition", i))
		}
		// Every level write is followed by one or two index writes.
		router, err := newRouter(mustJS(s.nc, 3*inflight+16), rc, routerWiring{
			reasons: &s.reasons, refused: &s.refused, hopKey: s.hopKey,
			scanners:   serviceScanners{scanners: scanners, store: store, owners: owners},
			lookupConn: s.cfg.LookupConn,
		})
		if err != nil {
			return err
		}
		routers[i] = router
	}
	routersRef.Store(&routers)

	// One elector per lease: the router's, each level stream's and the
	// janitor's, sharing the leases with the other live replicas.
	balancer, err := leadership.NewBalancer(leadership.BalancerConfig{Members: members, TTL: s.cfg.LeaseTTL,
		Logger: s.logger.With(slog.String("component", "balance"))})
	if err != nil {
		return err
	}
	leases := make(map[string]*leaseState, len(scanners)+2)
	type leasedWork struct {
		elector *leadership.Elector
		work    func(context.Context, leadership.Term) error
	}
	var works []leasedWork
	addLease := func(key string, work func(context.Context, leadership.Term) error) error {
		if s.noBid != nil && s.noBid(key) {
			return nil
		}
		e, err := leadership.New(leadership.Config{Bucket: bucket, Key: key, Holder: holder, TTL: s.cfg.LeaseTTL,
			Balancer: balancer, OnEvent: s.leaseEvent, Logger: s.logger.With(slog.String("component", "lease"))})
		if err != nil {
			return err
		}
		leases[key] = &leaseState{elector: e}
		works = append(works, leasedWork{e, work})
		return nil
	}
	for _, router := range routers { // works[:len(routers)]: started last, below
		if err := addLease(router.LeaseKey(), router.runTerm); err != nil {
			return err
		}
	}
	nRouters := len(works) // fewer than the routers where noBid skips some
	for _, name := range streams {
		if err := addLease(leadership.LevelKey(name), scanners[name].runTerm); err != nil {
			return err
		}
	}
	// The singleton jobs run in one replica at a time.
	if err := addLease(leadership.JanitorKey, func(ctx context.Context, _ leadership.Term) error {
		return s.runJanitor(ctx, store, members)
	}); err != nil {
		return err
	}
	s.balancer.Store(balancer)
	s.mu.Lock()
	s.routers, s.scanners, s.leases, s.holder = routers, scanners, leases, holder
	s.mu.Unlock()

	cancelSubs, cancelCh, err := s.subscribeCancel(ctx)
	if err != nil {
		return err
	}
	infoSub, err := s.subscribeInfo(ctx)
	if err != nil {
		for _, sub := range cancelSubs {
			_ = sub.Unsubscribe()
		}
		return err
	}
	defer func() { _ = infoSub.Unsubscribe() }()
	var wg sync.WaitGroup
	errs := make(chan error, len(works)+4)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { errs <- targets.Run(runCtx) })
	wg.Go(func() { errs <- balancer.Run(runCtx) })
	// Each elector runs its work only while it holds the lease, and
	// releases the lease after the work has settled and committed.
	// The router bids once every scanner made its first bid: a single
	// process then routes only once its scanners run, and the merge check
	// (pendingAt, which trusts only a scanner this process runs) works
	// from the first message.
	for _, o := range works[nRouters:] {
		wg.Go(func() { errs <- o.elector.Run(runCtx, o.work) })
	}
	for _, router := range works[:nRouters] {
		wg.Go(func() {
			for _, o := range works[nRouters:] {
				select {
				case <-o.elector.Tried():
				case <-runCtx.Done():
					errs <- nil
					return
				}
			}
			errs <- router.elector.Run(runCtx, router.work)
		})
	}
	cancelJS := mustJS(s.nc, 0)
	s.routed = newRoutedGate(cancelJS, s.refused.routerWaiting)
	s.lookups = newLookupGate(s.cfg.CancelLookupShare)
	wg.Go(func() { s.routed.run(runCtx) })
	wg.Go(func() { errs <- s.serveCancel(runCtx, cancelJS, cancelSubs, cancelCh) })
	members.Bidding() // the others count this replica in their shares from now on
	s.ready.Store(true)
	s.logger.Info("delayd scheduling", slog.String("ingress", s.cfg.Prefix+".>"), slog.Int("level_streams", len(streams)), slog.String("holder", holder))

	var first error
	go func() { wg.Wait(); close(errs) }()
	for err := range errs {
		if err != nil && first == nil {
			first = err
			cancel()
		}
	}
	s.ready.Store(false)
	return first
}

// runJanitor runs the singleton jobs while this replica holds the janitor
// lease: the id index trim, and the sweep of membership keys left by
// replicas that stopped without leaving (a crash).
func (s *Service) runJanitor(ctx context.Context, store *offsets.Store, members *lease.Membership) error {
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(memberSweepEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			sctx, cancel := context.WithTimeout(ctx, opTimeout)
			n, err := members.Sweep(sctx, memberSweepAfter)
			cancel()
			if err != nil && ctx.Err() == nil {
				s.logger.Warn("membership sweep failed", slog.Any("error", err))
			}
			if n > 0 {
				s.logger.Info("membership keys of stopped replicas deleted", slog.Int("keys", n))
			}
		}
	})
	err := s.trimIndex(ctx, store)
	wg.Wait()
	return err
}

// A membership key seen unchanged for memberSweepAfter (its replica
// stopped without leaving) is deleted by the janitor.
const (
	memberSweepEvery = time.Minute
	memberSweepAfter = 10 * time.Minute
)

// trimIndex purges the id index every indexTrimEvery until ctx is done.
// It keeps every record stored since the oldest head any level had
// IndexKeep ago: a message that left its level (delivered or cancelled)
// within the last IndexKeep was at or behind a head then, so its records
// are kept, and a cancel still gets its true answer.
func (s *Service) trimIndex(ctx context.Context, store *offsets.Store) error {
	js := mustJS(s.nc, 0)
	reader, err := jswire.NewBatchReader(s.nc, 1)
	if err != nil {
		return err
	}
	defer reader.Close()
	keep := cmp.Or(s.cfg.IndexKeep, IndexKeep)
	t := time.NewTicker(min(indexTrimEvery, keep/4))
	defer t.Stop()
	type sample struct {
		at     time.Time // when it was taken (delayd's clock)
		oldest time.Time // the oldest pending message then, or the server's time then (server clock)
	}
	var history []sample
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		s.trimPasses.Add(1)
		cutoff, err := s.oldestPending(ctx, js, reader, store)
		if err != nil {
			if ctx.Err() == nil {
				s.logger.Warn("id index trim skipped", slog.Any("error", err))
			}
			continue
		}
		now := time.Now()
		history = append(history, sample{at: now, oldest: cutoff})
		// The newest sample at least IndexKeep old decides; older ones go.
		i := -1
		for j, h := range history {
			if now.Sub(h.at) >= keep {
				i = j
			}
		}
		if i < 0 {
			continue
		}
		cutoff, history = history[i].oldest, history[i:]
		if cutoff.IsZero() {
			continue
		}
		tctx, cancel := context.WithTimeout(ctx, opTimeout)
		err = index.Trim(tctx, js, cutoff, indexStoreSkew)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.logger.Warn("id index trim failed", slog.Any("error", err))
		}
	}
}

const indexTrimEvery = 10 * time.Second

// indexStoreSkew is how much earlier than its level message an index
// record may be stored: the router publishes the level write first, but the
// server stores writes to different streams on their own goroutines
// (seen even on an idle server). Trims keep this much more.
const indexStoreSkew = 5 * time.Second

// oldestPending returns the store time of the oldest message any level
// still holds past its committed offset, or the server's time if none: no
// index record of a message not yet handed off is older. The server's time
// is read first, so a message stored during the reads is newer than it.
// It costs a stream info, an offset read and a direct get per level.
func (s *Service) oldestPending(ctx context.Context, js jetstream.JetStream, reader *jswire.BatchReader, store *offsets.Store) (time.Time, error) {
	nctx, cancel := context.WithTimeout(ctx, opTimeout)
	oldest := index.ServerNow(nctx, js)
	cancel()
	if oldest.IsZero() {
		return oldest, errors.New("no server time")
	}
	s.mu.Lock()
	scanners := make([]*Scanner, 0, len(s.scanners))
	for _, sc := range s.scanners {
		scanners = append(scanners, sc)
	}
	s.mu.Unlock()
	var buf []*nats.Msg
	for _, sc := range scanners {
		// The committed offset as stored: the janitor's replica scans
		// only its share of the levels, and its own view of the others'
		// offsets is stale. A level it owns counts its latest commit.
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		committed, err := store.Load(rctx, sc.cfg.Stream)
		if errors.Is(err, offsets.ErrNotFound) {
			committed, err = 0, nil // never committed: from the first message
		}
		if err != nil {
			cancel()
			return time.Time{}, err
		}
		if sc.owned.Load() {
			committed = max(committed, sc.commits.Committed())
		}
		buf, err = reader.Read(rctx, sc.cfg.Stream, buf[:0], committed+1, 1, 1)
		cancel()
		if err != nil {
			return time.Time{}, err
		}
		if len(buf) == 1 {
			if at, err := time.Parse(time.RFC3339Nano, buf[0].Header.Get(hdrJSTimeStamp)); err == nil && at.Before(oldest) {
				oldest = at
			}
		}
	}
	return oldest, nil
}

// join opens the lease bucket (without changing it) and starts this
// replica's membership: it fails with an error wrapping lease.ErrMismatch
// if a live replica's level table, prefix or replica count differs. The
// membership lasts until ctx ends.
func (s *Service) join(ctx context.Context, holder string) (*lease.Membership, error) {
	// 10 s: creates of the bucket sent at once by replicas started
	// together may go unanswered (see setupInTurn); the retry finds it.
	jctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	bucket, err := lease.BindBucket(jctx, mustJS(s.nc, 0), lease.BucketConfig{Replicas: s.cfg.Replicas})
	if err != nil {
		return nil, err
	}
	m, err := lease.NewMembership(bucket, lease.MembershipConfig{Holder: holder, TTL: s.cfg.LeaseTTL, Settings: s.sharedSettings(),
		Logger: s.logger.With(slog.String("component", "membership"))})
	if err != nil {
		return nil, err
	}
	if err := m.Start(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// sharedSettings are the settings every live replica must share, by the
// variable that sets each: they decide which streams exist and how.
func (s *Service) sharedSettings() map[string]string {
	return map[string]string{
		"DELAYD_LEVELS":     s.cfg.Levels.String(),
		"DELAYD_PARTITIONS": s.partitionsSetting,

		"DELAYD_INGRESS_PARTITIONS": strconv.Itoa(s.cfg.IngressPartitions),
		"DELAYD_PREFIX":             s.cfg.Prefix,
		"DELAYD_REPLICAS":           strconv.Itoa(s.cfg.Replicas),
	}
}

// permanent returns the error Run stops with for a setup or join error
// that no retry can mend, nil for any other: a replica count the server
// cannot give (not clustered) wraps [ErrReplicasUnsupported] and names
// DELAYD_REPLICAS.
func (s *Service) permanent(err error) error {
	var api *jetstream.APIError
	if errors.As(err, &api) && api.ErrorCode == jsErrReplicasNotSupported {
		return fmt.Errorf("DELAYD_REPLICAS=\"%d\": %w (%w)", s.cfg.Replicas, ErrReplicasUnsupported, err)
	}
	return nil
}

// jsErrReplicasNotSupported is JetStream's error code for a stream of
// more than one replica on a server that is not clustered
// (nats-server's JSStreamReplicasNotSupportedErr).
const jsErrReplicasNotSupported jetstream.ErrorCode = 10074

// setupInTurn runs setup while holding the lease [leadership.SetupKey], so
// that replicas set up one at a time: identical stream creates sent at
// once by several replicas to a cluster can all go unanswered
// (nats-server v2.15.2: three replicas started together waited 60 to 91 s
// for their streams, integration TestReplicasStartTogether). The lease is
// released once setup returns; one left by a replica that crashed in its
// setup is taken a lease TTL after its last renewal. Each later replica's
// setup finds every stream in place and changes nothing.
func (s *Service) setupInTurn(ctx context.Context, holder string) ([]string, *offsets.Store, *lease.Bucket, error) {
	bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	bucket, err := lease.BindBucket(bctx, mustJS(s.nc, 0), lease.BucketConfig{Replicas: s.cfg.Replicas})
	cancel()
	if err != nil {
		return nil, nil, nil, err
	}
	turn, err := lease.New(bucket, lease.Config{Key: leadership.SetupKey, Holder: holder, TTL: s.cfg.LeaseTTL,
		Logger: s.logger.With(slog.String("component", "lease"), slog.String("lease", leadership.SetupKey))})
	if err != nil {
		return nil, nil, nil, err
	}
	if err := turn.Acquire(ctx); err != nil {
		return nil, nil, nil, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := turn.Release(rctx); err != nil {
			s.logger.Warn("setup lease not released; the next replica takes it after the lease TTL", slog.Any("error", err))
		}
	}()
	return s.setup(ctx)
}

// setup creates or updates every stream, the offsets and lease buckets, and returns
// the level streams to scan: the table's, the immediate level's, and any
// DELAYD_<duration> stream left from an earlier table.
func (s *Service) setup(ctx context.Context) ([]string, *offsets.Store, *lease.Bucket, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	js := mustJS(s.nc, 0)
	r := s.cfg.Replicas
	if err := s.ensureIngress(ctx, js); err != nil {
		return nil, nil, nil, err
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        DLQStream,
		Description: "delayd dead letters: invalid or undeliverable messages with Delay-Error and Delay-Subject",
		Subjects:    []string{dlqSubjects + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    r,
		Duplicates:  DuplicateWindowDefault,
	}); err != nil {
		return nil, nil, nil, fmt.Errorf("stream %s: %w", DLQStream, err)
	}
	if err := index.EnsureStreams(ctx, js, r); err != nil {
		return nil, nil, nil, err
	}
	want := append([]levels.Level{{}}, s.cfg.Levels.Levels()...)
	want = append(want, s.cfg.Levels.PrecisionLevels()...)
	var streams []string
	for _, l := range want {
		for _, name := range s.cfg.Partitions.Streams(l.Delay) {
			if err := ensureLevelStream(ctx, js, name, l.Delay, r); err != nil {
				return nil, nil, nil, err
			}
			streams = append(streams, name)
		}
	}
	names := js.StreamNames(ctx, jetstream.WithStreamListSubject(levelSubjects+">"))
	for name := range names.Name() {
		if _, ok := levels.ParseStreamName(name); ok && !slices.Contains(streams, name) {
			s.logger.Info("draining level stream no longer in the table", slog.String("stream", name))
			streams = append(streams, name)
		}
	}
	if err := names.Err(); err != nil {
		return nil, nil, nil, fmt.Errorf("list level streams: %w", err)
	}
	store, err := offsets.New(ctx, js, offsets.Config{Replicas: r, Logger: s.logger.With(slog.String("component", "offsets"))})
	if err != nil {
		return nil, nil, nil, err
	}
	if s.hopKey, err = loadHopKey(ctx, js, s.logger); err != nil {
		return nil, nil, nil, err
	}
	existing := make(map[time.Duration][]string)
	for _, name := range streams {
		d, _ := levels.ParseStreamName(name)
		existing[d] = append(existing[d], name)
	}
	if s.boundaries, err = s.partitionBoundaries(ctx, js, want, existing); err != nil {
		return nil, nil, nil, err
	}
	bucket, err := lease.OpenBucket(ctx, js, lease.BucketConfig{Replicas: r})
	if err != nil {
		return nil, nil, nil, err
	}
	return streams, store, bucket, nil
}

// ensureLevelStream creates or updates the level stream name (a
// [levels.StreamName] or [levels.PartitionStreamName]) of delay, on the
// subjects "delayd.level.<name without DELAYD_>.>".
func ensureLevelStream(ctx context.Context, js jetstream.JetStream, name string, delay time.Duration, replicas int) error {
	desc := "delayd level " + levels.FormatDuration(delay) + ": messages waiting for their due time"
	if _, part, _ := levels.ParseStream(name); part >= 0 {
		desc = fmt.Sprintf("delayd level %s, partition %d: messages waiting for their due time", levels.FormatDuration(delay), part)
	}
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        name,
		Description: desc,
		Subjects:    []string{levelSubjects + strings.TrimPrefix(name, levels.StreamPrefix) + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		AllowDirect: true,
		// The router writes with Nats-Expected-Last-Sequence and no
		// Nats-Msg-Id, so the smallest window keeps no ids in memory.
		Duplicates: 100 * time.Millisecond,
	})
	if err != nil {
		return fmt.Errorf("stream %s: %w", name, err)
	}
	return nil
}

// mustJS returns a JetStream context with its own async-publish window, so
// that one level's slow target never stalls another's publishes.
func mustJS(nc *nats.Conn, maxPending int) jetstream.JetStream {
	opts := []jetstream.JetStreamOpt{jetstream.WithPublishAsyncTimeout(publishAsyncTimeout)}
	if maxPending > 0 {
		opts = append(opts, jetstream.WithPublishAsyncMaxPending(maxPending))
	}
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		panic(err) // only invalid options fail, and these are constant
	}
	return js
}

// serviceScanners is the router's view of a Service's scanners
// ([levelScanners]).
type serviceScanners struct {
	scanners map[string]*Scanner
	store    *offsets.Store
	owners   *pendingAsker // asks the owner of a level this replica does not own
}

// pendingAt answers from this replica's scanner when it owns the level
// (once its term's start loaded the offset and tombstones: it waits for
// that up to decidePendingWait), and otherwise asks the level's owner on
// its decide subject. No answer (no owner, a failover, a timeout) is "not
// pending": that costs a merge, never a message merged into one already
// delivered.
func (v serviceScanners) pendingAt(ctx context.Context, rec index.Record) bool {
	sc := v.scanners[rec.Stream]
	switch {
	case sc == nil:
		return false
	case sc.owned.Load():
		for deadline := time.Now().Add(decidePendingWait); !sc.decides.Load(); {
			if !sc.owned.Load() || time.Now().After(deadline) {
				return false
			}
			time.Sleep(time.Millisecond) // a term's first moments only
		}
		return sc.pendingAt(rec)
	case v.owners != nil:
		return v.owners.pending(ctx, rec)
	}
	return false
}

// passed answers from this replica's scanner when it owns the level, and
// otherwise asks the level's owner; 0 (nothing passed) without an answer.
func (v serviceScanners) passed(ctx context.Context, stream string) uint64 {
	sc := v.scanners[stream]
	switch {
	case sc == nil:
		return 0
	case sc.owned.Load():
		if !sc.decides.Load() {
			return 0 // its term's start has not loaded the offset yet
		}
		return sc.passed.Load()
	case v.owners != nil:
		return v.owners.passed(ctx, stream)
	}
	return 0
}

func (v serviceScanners) committed(ctx context.Context, stream string) uint64 {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	off, err := v.store.Load(ctx, stream)
	if err != nil {
		return 0
	}
	return off
}

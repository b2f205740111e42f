package ownership

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/supervise"
	"github.com/delayd/delayd/internal/lease"
)

// ServiceConfig configures a [Service].
type ServiceConfig struct {
	// TTL is the leases' and the membership's TTL, T. Optional. Default
	// lease.TTLDefault.
	TTL time.Duration

	// OnEvent is every elector's [Config].OnEvent. Optional.
	OnEvent func(Event)

	// Logger is optional. Default discards. Each part logs with its own
	// "component": "membership", "lease" (the setup turn and the
	// electors), "balance".
	Logger *slog.Logger
}

// Service is this replica's side of the leases as one value
// (docs/reshape.md#31-the-supervisor): its holder id, its membership among
// the replicas ([Service.Join], [Service.Leave]), its setup turn
// ([Service.SetupTurn]), the [Balancer] and one [Elector] per lease key it
// bids for ([Service.Lease]), run by [Service.Plan] in the order of a
// [Plan].
//
// The goroutine that runs the replica (deliver's Service.Run) calls Join,
// SetupTurn, Open and Lease in that order and is the only writer of its
// fields; once Plan's component runs they are read-only, and Plan's
// goroutines run the balancer and the electors.
type Service struct {
	holder  string
	ttl     time.Duration
	onEvent func(Event)
	logger  *slog.Logger

	members  *lease.Membership  // set by Join
	leave    context.CancelFunc // ends the membership; set by Join
	bucket   *lease.Bucket      // the electors' bucket; set by Open
	balancer *Balancer          // set by Open
}

// NewService returns a Service with a fresh holder id
// (lease.NewHolderID), not joined. It touches no server.
func NewService(cfg ServiceConfig) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{holder: lease.NewHolderID(), ttl: cfg.TTL, onEvent: cfg.OnEvent, logger: cfg.Logger}
}

// Holder returns this replica's holder id.
func (o *Service) Holder() string { return o.holder }

// Join makes one attempt to bind the lease bucket (without changing it;
// bounded by 10 s) and start this replica's membership with settings: it
// fails with an error wrapping lease.ErrMismatch if a live replica's
// settings differ. The membership lasts until [Service.Leave] or until
// ctx ends. After an error, Join may be called again.
func (o *Service) Join(ctx context.Context, js jetstream.JetStream, bc lease.BucketConfig, settings map[string]string) error {
	mctx, leave := context.WithCancel(ctx)
	// 10 s: creates of the bucket sent at once by replicas started
	// together may go unanswered (see SetupTurn); the retry finds it.
	jctx, cancel := context.WithTimeout(mctx, 10*time.Second)
	defer cancel()
	bucket, err := lease.BindBucket(jctx, js, bc)
	if err != nil {
		leave()
		return err
	}
	m, err := lease.NewMembership(bucket, lease.MembershipConfig{Holder: o.holder, TTL: o.ttl, Settings: settings,
		Logger: o.logger.With(slog.String("component", "membership"))})
	if err != nil {
		leave()
		return err
	}
	if err := m.Start(mctx); err != nil {
		leave()
		return err
	}
	o.members, o.leave = m, leave
	return nil
}

// Leave ends the membership Join started, if any, and waits until its key
// is deleted (bounded: 5 s).
func (o *Service) Leave() {
	if o.leave == nil {
		return
	}
	o.leave()
	<-o.members.Done()
}

// Bidding tells the other replicas to count this one in their shares from
// now on ([lease.Membership.Bidding]). Join must have succeeded.
func (o *Service) Bidding() { o.members.Bidding() }

// Members returns the membership Join started; nil before.
func (o *Service) Members() *lease.Membership { return o.members }

// SetupTurn runs setup while holding the lease [SetupKey], so that
// replicas set up one at a time: identical stream creates sent at once by
// several replicas to a cluster can all go unanswered (nats-server
// v2.15.2: three replicas started together waited 60 to 91 s for their
// streams, integration TestReplicasStartTogether). The lease is released
// once setup returns; one left by a replica that crashed in its setup is
// taken a lease TTL after its last renewal. Each later replica's setup
// finds every stream in place and changes nothing. It returns setup's
// error, or the error that kept it from taking its turn.
func (o *Service) SetupTurn(ctx context.Context, js jetstream.JetStream, bc lease.BucketConfig, setup func(context.Context) error) error {
	bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	bucket, err := lease.BindBucket(bctx, js, bc)
	cancel()
	if err != nil {
		return err
	}
	turn, err := lease.New(bucket, lease.Config{Key: SetupKey, Holder: o.holder, TTL: o.ttl,
		Logger: o.logger.With(slog.String("component", "lease"), slog.String("lease", SetupKey))})
	if err != nil {
		return err
	}
	if err := turn.Acquire(ctx); err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := turn.Release(rctx); err != nil {
			o.logger.Warn("setup lease not released; the next replica takes it after the lease TTL", slog.Any("error", err))
		}
	}()
	return setup(ctx)
}

// Open readies the Service to make electors bidding in bucket (the one
// setup created), sharing the leases with the other live replicas: it
// makes the [Balancer] over the membership. Join must have succeeded.
func (o *Service) Open(bucket *lease.Bucket) error {
	b, err := NewBalancer(BalancerConfig{Members: o.members, TTL: o.ttl,
		Logger: o.logger.With(slog.String("component", "balance"))})
	if err != nil {
		return err
	}
	o.bucket, o.balancer = bucket, b
	return nil
}

// Balancer returns the balancer Open made; nil before.
func (o *Service) Balancer() *Balancer { return o.balancer }

// Work is what an elector runs for each term of its lease.
type Work func(ctx context.Context, t Term) error

// Lease is one lease key's elector with the work it runs for each term,
// made by [Service.Lease] and started only by a [Plan].
type Lease struct {
	e    *Elector
	work Work
}

// Elector returns the lease's elector, for its state ([Elector.Held]).
func (l Lease) Elector() *Elector { return l.e }

// Lease makes the elector of key, in the bucket Open was given, sharing
// through the balancer; it runs work for each term once a [Plan] starts
// it. It returns an error for an invalid key.
func (o *Service) Lease(key string, work Work) (Lease, error) {
	e, err := New(Config{Bucket: o.bucket, Key: key, Holder: o.holder, TTL: o.ttl,
		Balancer: o.balancer, OnEvent: o.onEvent, Logger: o.logger.With(slog.String("component", "lease"))})
	if err != nil {
		return Lease{}, err
	}
	return Lease{e: e, work: work}, nil
}

// Plan is the order the electors start in (docs/reshape.md#7-risks-rules-that-live-in-comments-today-and-how-the-structure-enforces-them, R1):
// every First elector at once, and each Then elector only once every
// First elector's first bid was answered ([Elector.Tried]). delayd puts
// the level streams and the janitor in First and the routers in Then: a
// single process then routes only once its scanners run, and the merge
// check (pendingAt, which trusts only a scanner this process runs) works
// from the first message.
type Plan struct {
	First, Then []Lease
}

// Run runs every elector of p until ctx is done, each on a goroutine of
// its own, the Then electors after every First elector's first bid (a
// Then elector whose wait ends with ctx returns nil without bidding). Each
// elector runs its work only while it holds the lease, and releases the
// lease after the work has settled and committed. The first error (a work
// that cannot run at all) stops the others; Run returns it once all have
// returned.
func (p Plan) Run(ctx context.Context) error {
	g := supervise.New(ctx, nil)
	for _, l := range p.First {
		g.Go(l.e.key, supervise.Func(func(ctx context.Context) error { return l.e.Run(ctx, l.work) }))
	}
	for _, l := range p.Then {
		g.Go(l.e.key, supervise.Func(func(ctx context.Context) error {
			for _, f := range p.First {
				select {
				case <-f.e.Tried():
				case <-ctx.Done():
					return nil
				}
			}
			return l.e.Run(ctx, l.work)
		}))
	}
	return g.Wait()
}

// Plan returns the component that runs the balancer and p's electors
// ([Plan.Run]) until its context ends; Open must have been called.
func (o *Service) Plan(p Plan) supervise.Component {
	return supervise.Func(func(ctx context.Context) error {
		g := supervise.New(ctx, nil)
		g.Go("balance", supervise.Func(o.balancer.Run))
		g.Go("electors", p)
		return g.Wait()
	})
}

package ownership

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/delayd/delayd/internal/lease"
)

// SetupKey is the lease key a replica holds while it creates or updates
// delayd's streams and buckets at start: replicas set up one at a time.
// No elector bids for it.
const SetupKey = "setup"

// JanitorKey is the lease key of the singleton jobs (the id index trim,
// the sweep of stopped replicas' membership keys): one replica runs them.
const JanitorKey = "janitor"

// BalancerConfig configures a [Balancer].
type BalancerConfig struct {
	// Members is this replica's membership, started. Required.
	Members *lease.Membership

	// TTL is the leases' TTL, T. Optional. Default lease.TTLDefault.
	TTL time.Duration

	// IdleBid is how long a lease may stay free to take (released, or held
	// by a replica that stopped renewing it for TTL) before a replica
	// takes it whatever its share: liveness before balance, when two
	// replicas disagree on how many are live. Optional. Default 2×TTL.
	IdleBid time.Duration

	// Logger is optional. Default discards.
	Logger *slog.Logger
}

// Balancer shares the leases of its electors with the other live
// replicas (docs/operations.md#several-replicas). A replica's share is
// ceil(leases / live replicas), where leases counts this replica's
// electors and live replicas come from the [lease.Membership].
//
//   - An elector bids for a free lease (released, never written, or
//     unchanged for TTL) only while this replica holds fewer than its
//     share, counting bids in flight; a lease free for longer than IdleBid
//     is taken by any replica.
//   - A replica holding more than its share (a replica joined), or
//     holding its share while another live replica holds two fewer (as
//     read from the lease keys), hands one lease over at a time: the elector's work returns
//     (confirm, commit), the lease is released, and a replica below its
//     share takes it at once. The next one goes once another replica
//     holds the last (or after IdleBid).
//   - A replica at its share keeps what it holds.
//
// Its electors bid through [Balancer.Claimer], the lock-guarded [bids].
type Balancer struct {
	members *lease.Membership // its own lock
	ttl     time.Duration
	idleBid time.Duration
	logger  *slog.Logger

	bids *bids // the electors' lease.Claimer and what the hand-overs share with it

	// Run's goroutine's only (tick).
	yieldAt time.Time // when bids.yielding was set
	live    int       // at the last tick
	liveAt  time.Time // when live last changed
}

// bids is a lock-guarded value and nothing else: what a [Balancer]'s
// electors' bids and its hand-overs share. Its Claim is every elector's
// [lease.Claimer], the one door each elector's goroutine passes when it
// bids, by design: mu serializes the bids so that two electors bidding at
// once never both take the last place in the share. The Balancer's Run
// goroutine (tick) holds mu through a hand-over decision, so a bid never
// sees half of one, and stats readers count what is held under it
// (docs/reshape.md, R4 goroutines).
type bids struct {
	members *lease.Membership // set by NewBalancer, never written after
	idleBid time.Duration
	logger  *slog.Logger

	mu       sync.Mutex
	electors []*Elector // added while the electors are built, before Run
	claims   int        // bids between Claim and their answer
	yielding *Elector   // handing over, until another replica holds its lease
}

// NewBalancer returns a balancer over cfg.Members; electors join it
// through [Config].Balancer. It returns an error without Members.
func NewBalancer(cfg BalancerConfig) (*Balancer, error) {
	if cfg.Members == nil {
		return nil, errors.New("leadership: balancer: Members is required")
	}
	if cfg.TTL == 0 {
		cfg.TTL = lease.TTLDefault
	}
	if cfg.IdleBid == 0 {
		cfg.IdleBid = 2 * cfg.TTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Balancer{members: cfg.Members, ttl: cfg.TTL, idleBid: cfg.IdleBid, logger: cfg.Logger,
		bids: &bids{members: cfg.Members, idleBid: cfg.IdleBid, logger: cfg.Logger}}, nil
}

// Claimer returns the electors' [lease.Claimer]: their bids go ahead only
// within this replica's share ([bids.Claim]).
func (b *Balancer) Claimer() lease.Claimer { return b.bids }

func (b *Balancer) add(e *Elector) {
	b.bids.mu.Lock()
	defer b.bids.mu.Unlock()
	b.bids.electors = append(b.bids.electors, e)
}

// Share returns the live replicas (this one included), this replica's
// share of the leases, and how many it holds now.
func (b *Balancer) Share() (live, share, held int) {
	b.bids.mu.Lock()
	defer b.bids.mu.Unlock()
	live = b.members.Live()
	return live, shareOf(len(b.bids.electors), live), len(b.bids.heldLocked())
}

// shareOf is ceil(leases / live).
func shareOf(leases, live int) int { return (leases + live - 1) / max(live, 1) }

// heldLocked returns the electors holding a valid term now. b.mu is held.
func (b *bids) heldLocked() []*Elector {
	var out []*Elector
	for _, e := range b.electors {
		if _, valid := e.lease.Held(); valid {
			out = append(out, e)
		}
	}
	return out
}

// fewestLocked returns the fewest leases any other live replica holds, as
// this replica last read the lease keys it does not hold (each at least
// every TTL/3); len(electors) if no other replica is live. settled is
// false while leases change hands as far as this replica can tell: one
// is free as last read, or the count of live replicas changed less than
// a TTL ago (a replica stopped or joined: the others' counts as read lag
// their takes until every key is read again). b.bids.mu is held (tick).
func (b *Balancer) fewestLocked() (fewest int, settled bool) {
	counts := map[string]int{}
	self := ""
	settled = time.Since(b.liveAt) >= b.ttl
	for _, e := range b.bids.electors {
		self = e.holder
		if _, valid := e.lease.Held(); valid {
			continue
		}
		h, _ := e.lease.Observed()
		if h == "" || h == e.holder {
			settled = false
			continue
		}
		counts[h]++
	}
	fewest = len(b.bids.electors)
	for _, m := range b.members.Members() {
		if m != self {
			fewest = min(fewest, counts[m])
		}
	}
	return fewest, settled
}

// Claim implements [lease.Claimer]: a bid goes ahead while this replica holds
// (with bids in flight) fewer than its share, or for a lease free for
// IdleBid.
func (b *bids) Claim(key string, idle time.Duration) (done func(), ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	share := shareOf(len(b.electors), b.members.Live())
	if idle < b.idleBid && len(b.heldLocked())+b.claims >= share {
		return nil, false
	}
	if y := b.yielding; y != nil && y.key == key && idle < b.idleBid {
		return nil, false // just handed over: for another replica
	}
	if idle >= b.idleBid {
		b.logger.Debug("lease free for the grace: bidding beyond the share", slog.String("lease", key), slog.Duration("idle", idle))
	}
	b.claims++
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			b.claims--
			b.mu.Unlock()
		})
	}, true
}

// Run balances until ctx is done, then returns nil: every TTL/10 it
// wakes the electors when the count of live replicas changed (their bids'
// answers may change) and hands one surplus lease over.
func (b *Balancer) Run(ctx context.Context) error {
	t := time.NewTicker(b.ttl / 10)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		b.tick()
	}
}

func (b *Balancer) tick() {
	bd := b.bids
	bd.mu.Lock()
	defer bd.mu.Unlock()
	live := b.members.Live()
	if live != b.live {
		if b.live != 0 {
			b.logger.Info("live replicas changed", slog.Int("live", live), slog.Int("was", b.live),
				slog.Int("share", shareOf(len(bd.electors), live)))
		}
		b.live, b.liveAt = live, time.Now()
		for _, e := range bd.electors {
			e.lease.Wake()
		}
	}
	if y := bd.yielding; y != nil {
		// One hand-over at a time: the next once another replica holds
		// this one (its work has confirmed, committed and released it),
		// or after idleBid.
		holder, _ := y.lease.Observed()
		_, valid := y.lease.Held()
		if taken := !valid && holder != "" && holder != y.holder; !taken && time.Since(b.yieldAt) < b.idleBid {
			return
		}
		bd.yielding = nil
	}
	// Hand one over when holding more than the share (a replica
	// joined), or when at the share while another live replica holds two
	// fewer (ceil leaves slack: 14 leases on 4 replicas could rest at
	// 4, 4, 4, 2), as read once the leases have settled ([Balancer.fewestLocked]): right
	// after a replica stopped, the others' counts as read lag their
	// takes, and a replica at its share would hand over a lease the
	// other takes anyway. A replica below its share never hands over.
	held := bd.heldLocked()
	share := shareOf(len(bd.electors), live)
	if len(held) < share {
		return
	}
	if len(held) == share {
		if fewest, settled := b.fewestLocked(); !settled || len(held) < fewest+2 {
			return
		}
	}
	// The last key in order: deterministic, and the router (which sorts
	// after "level.") goes before the levels it feeds. A lease whose work
	// is recovering ([Term.Recovering]) stays: handed over now, the next
	// holder's start would add to the recovery.
	slices.SortFunc(held, func(x, y *Elector) int { return strings.Compare(x.key, y.key) })
	held = slices.DeleteFunc(held, func(e *Elector) bool { return e.recovering.Load() })
	if len(held) == 0 {
		return
	}
	e := held[len(held)-1]
	if e.handOver() {
		bd.yielding, b.yieldAt = e, time.Now()
		b.logger.Debug("handing a lease over", slog.String("lease", e.key), slog.Int("held", len(held)),
			slog.Int("share", share), slog.Int("live", live))
	}
}

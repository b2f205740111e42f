// Package lease gives a delayd replica fenced, exclusive ownership of one
// piece of work (the router, a level stream or partition, a singleton job)
// through a key in the DELAYD_LEASES JetStream key-value bucket.
//
// It lives in internal/ rather than deliver/internal/ because more than
// deliver reads leases: cmd/delayd (readiness: a replica that can take a
// lease) and cmd/delayctl (stats: which replica owns what, at which epoch)
// decode the same values.
//
// # Protocol
//
// A lease is one key. Its value ([Value]) names the holder and its epoch,
// as JSON: {"v":1,"holder":"host-1234-9f2c","epoch":7}. T is the lease's
// TTL ([Config.TTL], default [TTLDefault], 1.5 s).
//
//   - Acquire: Create the key (epoch 1); or, when the key names a holder
//     (or was deleted, purged or garbled by hand), Update it at a revision
//     seen unchanged for T on the local monotonic clock, counted from the
//     first Get response that showed that revision; or, when its holder is
//     empty (released), Update at once. The new epoch
//     is the old one + 1. A key deleted or purged by hand, or a value that
//     does not decode, is replaced with epoch = its revision + 1, which
//     exceeds every epoch written before (an epoch e is always written at a
//     revision >= e), so epochs strictly increase on every change of holder.
//   - Renew: every T/3, Update at the revision the holder last wrote, with
//     the same value.
//   - Fence: the holder's term is valid until (the send time of its last
//     successful write + T - margin), on its monotonic clock. A failed
//     compare-and-set (someone else wrote the key) ends the term at once. A
//     renewal that fails otherwise (a timeout, no responders during a NATS
//     election) is retried at the next tick; the term expires at its fence
//     if none succeeds.
//   - Release: end the term, then Update the key at the held revision to an
//     empty holder with the same epoch, so a waiting replica takes it at
//     once instead of after T.
//
// Membership ([Membership]): each replica also writes a key
// "member.<holder>", renewed every T/3 and deleted when it stops; another
// replica counts it live while it sees the key's revision change within T.
// The keys carry the settings every live replica must share (the level
// table), checked at start, and let replicas balance their leases
// ([Claimer]). (Not a per-key TTL: nats.go's Update and Put clear a key's TTL,
// and enabling TTLs on the bucket cannot be undone, so an older delayd's
// idempotent bucket update would then fail.)
//
// No wall clock of one machine is ever compared with another's: every
// instant above is a [time.Now] reading compared, through its monotonic
// part, with another reading of the same process.
//
// # Safety
//
// Claim: two terms of one lease are never valid at the same real instant.
// Assumption: every replica's monotonic clock runs at a rate within rho of
// real time (|rate - 1| <= rho), and margin >= 2*rho*T/(1+rho); the default
// margin T/10 tolerates rho up to 5 %, far beyond any quartz clock (about
// 1e-4). Clocks need not be synchronised.
//
// Suppose A's last successful write, sent at real time sA, stored revision
// r. A's term ends no later than real time sA + (T-margin)/(1-rho). A
// contender B that takes the lease from A Updates at revision r (an Update
// at any other revision fails: the key's revision is a compare-and-set
// token). B saw r first in a Get response that arrived at real time
// oB >= sA (r was stored after A sent it, and B read it after it was
// stored), and sends its Update only after T more on its own clock, at real
// time >= sA + T/(1+rho) >= sA + (T-margin)/(1-rho). So B's term starts
// after A's ended. If A's renewal at r is stored first, B's Update fails;
// if B's is, A's next renewal fails and A's term ends at once (it had
// already expired by the argument above). A release ends A's term before
// its empty-holder write is sent, so a taker after a release is safe too.
//
// Limits, stated honestly:
//   - A term's validity is a check at one instant. A holder paused between
//     [Lease.Held] and its write (a GC pause, SIGSTOP) writes after its
//     fence. So every fenced write must also carry its own compare-and-set
//     (an offset commit at the offset key's revision, an expected last
//     sequence on a level stream); the lease decides who should write, the
//     compare-and-set makes a stale write fail.
//   - Go's monotonic clock on Linux is CLOCK_MONOTONIC, which stops while
//     the machine is suspended. A holder on a suspended machine wakes up
//     believing no time passed; the compare-and-set on its writes is then
//     the only fence. A stopped process (SIGSTOP) or a paused goroutine is
//     fine: the clock keeps running.
//   - [Lease.Context] is cancelled by a timer at the fence instant, so a
//     paused process sees it late. [Lease.Held] reads the clock and is exact.
package lease

package routing

import (
	"fmt"
	"sync"

	"github.com/delayd/delayd/deliver/internal/index"
)

// mergeCacheMax bounds the router's cache of the latest placement of each
// merge key it placed (about 100 bytes an entry).
const mergeCacheMax = 1 << 16

// mergeCache holds the placements of merge keys this process placed, so the
// next message with a key and target is merged without an index lookup.
// The router is the only writer of placements, so a key it placed is
// current here until evicted (oldest first, beyond mergeCacheMax keys).
//
// It is a lock-guarded value and nothing else: every method takes the lock
// for its whole body around one call of [mergePlacements], which holds the
// state and its rules. It is the one value of the router's that more than
// two goroutines call, by design (docs/reshape.md, R4 goroutines): the
// router's session goroutine adds and looks up keys (and resets it at each
// term), the write pipeline's confirmer confirms them, the level streams'
// sync helpers remember the keys they re-index (tailSync.reindex), and the
// level owners free the keys of cancelled messages ([MergeCaches.Forget]).
// The re-index remembers on its helper, not later on the session
// goroutine: a key cached there is merged into without an index lookup,
// so remembering it later would change which messages merge meanwhile; a
// level owner's Forget must land before the next placement of its key,
// which a hand-off to the session goroutine would not keep.
type mergeCache struct {
	mu sync.Mutex
	p  mergePlacements // only with mu held
}

// lookup returns the placement of merge-index key k: in flight first, then
// confirmed. ok is false when the cache does not know k (the index may).
func (c *mergeCache) lookup(k string) (rec index.Record, ok bool) {
	rec, _, ok = c.lookupFlight(k)
	return rec, ok
}

// The methods below are [mergePlacements]' own, under the lock.

func (c *mergeCache) lookupFlight(k string) (rec index.Record, inFlight, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.p.lookupFlight(k)
}

func (c *mergeCache) submitted(rec index.Record) { c.mu.Lock(); c.p.submitted(rec); c.mu.Unlock() }

func (c *mergeCache) confirmed(rec index.Record, ok bool) {
	c.mu.Lock()
	c.p.confirmed(rec, ok)
	c.mu.Unlock()
}

func (c *mergeCache) forget(rec index.Record)   { c.mu.Lock(); c.p.forget(rec); c.mu.Unlock() }
func (c *mergeCache) reset()                    { c.mu.Lock(); c.p.reset(); c.mu.Unlock() }
func (c *mergeCache) remember(rec index.Record) { c.mu.Lock(); c.p.remember(rec); c.mu.Unlock() }

// mergePlacements is a merge cache's state: the placements in flight and
// the latest confirmed ones. Not safe for concurrent use: its methods run
// only under its [mergeCache]'s lock.
type mergePlacements struct {
	flight map[string]index.Record // placements whose level write is not confirmed yet
	recent map[string]index.Record // the latest confirmed placement of each key
	order  []string                // recent's keys, oldest first, for eviction
}

// MergeCaches are the routers' merge caches, one per ingress partition:
// the router of partition i places with cache i and resets it at each of
// its terms, and a level owner that frees a merge key forgets it in every
// one ([MergeCaches.Forget]). A deliver.Service builds them before its
// level owners and routers and hands them to both. The slice is never
// written after [NewMergeCaches]; each cache has its own lock.
type MergeCaches struct{ byPart []*mergeCache }

// NewMergeCaches returns empty merge caches for partitions ingress
// partitions (at least one).
func NewMergeCaches(partitions int) *MergeCaches {
	m := &MergeCaches{byPart: make([]*mergeCache, max(partitions, 1))}
	for i := range m.byPart {
		m.byPart[i] = newMergeCache()
	}
	return m
}

// Forget records in every router's cache that a merge key's message was
// cancelled: the key is free (rec is its "cancelled" record). The level
// owners call it, from any goroutine.
func (m *MergeCaches) Forget(rec index.Record) {
	for _, c := range m.byPart {
		c.forget(rec)
	}
}

// of returns ingress partition part's cache.
func (m *MergeCaches) of(part int) (*mergeCache, error) {
	if part < 0 || part >= len(m.byPart) {
		return nil, fmt.Errorf("deliver: router: ingress partition %d has no merge cache (%d)", part, len(m.byPart))
	}
	return m.byPart[part], nil
}

func newMergeCache() *mergeCache {
	return &mergeCache{p: mergePlacements{flight: make(map[string]index.Record), recent: make(map[string]index.Record)}}
}

// lookupFlight is lookup, also reporting whether the placement is in
// flight (its index records are not stored yet).
func (c *mergePlacements) lookupFlight(k string) (rec index.Record, inFlight, ok bool) {
	if rec, inFlight = c.flight[k]; inFlight {
		return rec, true, true
	}
	rec, ok = c.recent[k]
	return rec, false, ok
}

// submitted records a placement whose level write was sent.
func (c *mergePlacements) submitted(rec index.Record) { c.flight[rec.Key] = rec }

// confirmed moves a placement from in flight to confirmed once its level
// write is confirmed (ok), or forgets it when the write failed: it is routed
// again, and must not merge into its own failed placement. A placement in
// flight that a later one replaced is left alone.
func (c *mergePlacements) confirmed(rec index.Record, ok bool) {
	cur, inFlight := c.flight[rec.Key]
	if !inFlight || cur.Stream != rec.Stream || cur.Seq != rec.Seq {
		return
	}
	delete(c.flight, rec.Key)
	if ok {
		c.remember(rec)
	}
}

// forget records that a merge key's message was cancelled: the key is free
// (rec is its "cancelled" record).
func (c *mergePlacements) forget(rec index.Record) {
	delete(c.flight, rec.Key)
	c.remember(rec)
}

// reset forgets every placement: a router starting a new term of its
// lease knows nothing of what another replica's router placed or what
// other replicas' scanners freed meanwhile.
func (c *mergePlacements) reset() {
	clear(c.flight)
	clear(c.recent)
	c.order = nil
}

// remember caches a confirmed placement (from the re-index at start, a
// confirmed write or a cancel).
func (c *mergePlacements) remember(rec index.Record) {
	if _, ok := c.recent[rec.Key]; !ok {
		if len(c.order) >= mergeCacheMax {
			delete(c.recent, c.order[0])
			c.order = c.order[1:]
		}
		c.order = append(c.order, rec.Key)
	}
	c.recent[rec.Key] = rec
}

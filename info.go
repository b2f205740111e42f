package delayd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
)

// InfoSubject is delayd's info API (NATS request/reply): the reply is an
// [Info] as JSON, the running delayd's configuration.
const InfoSubject = contract.InfoSubject

// Info is the running delayd's configuration, as its info API answers:
// version, prefix, level table (and precision levels), max delay, target
// policy, and the payload limit. See [contract.InfoReply] for the fields.
type Info = contract.InfoReply

// InfoTTL is how long [Publish] keeps a connection's [Info] before it asks
// again, so a client sees a reconfigured delayd within a minute.
const InfoTTL = time.Minute

// infoTimeout bounds [Publish]'s info request: with no delayd running the
// server answers "no responders" at once; this only limits a stuck one.
const infoTimeout = 2 * time.Second

// FetchInfo asks the running delayd for its [Info] on nc, uncached.
//
// Errors: nats.ErrNoResponders when no delayd answers (not running, or a
// delayd without the info API); context errors; a JSON error for a bad
// reply.
func FetchInfo(ctx context.Context, nc *nats.Conn) (*Info, error) {
	m, err := nc.RequestWithContext(ctx, InfoSubject, nil)
	if err != nil {
		return nil, fmt.Errorf("delayd: info: %w", err)
	}
	var info Info
	if err := json.Unmarshal(m.Data, &info); err != nil {
		return nil, fmt.Errorf("delayd: info: bad reply: %w", err)
	}
	return &info, nil
}

type cachedInfo struct {
	info *Info // nil: the request timed out (a stuck delayd, or no permission for InfoSubject)
	err  error
	at   time.Time
}

// infoCache holds each connection's latest Info; entries of closed
// connections are dropped whenever an Info is fetched.
var infoCache sync.Map // *nats.Conn -> cachedInfo

// connInfo returns nc's Info from the cache, or asks delayd (at most
// infoTimeout). "No responders" (no delayd running) is not cached, since it
// costs one round trip; a timeout is, for InfoTTL, so that a user without
// permission for InfoSubject does not wait on every publish.
func connInfo(ctx context.Context, nc *nats.Conn) (*Info, error) {
	if c, ok := infoCache.Load(nc); ok && time.Since(c.(cachedInfo).at) < InfoTTL {
		return c.(cachedInfo).info, c.(cachedInfo).err
	}
	rctx, cancel := context.WithTimeout(ctx, infoTimeout)
	defer cancel()
	info, err := FetchInfo(rctx, nc)
	if err != nil {
		if ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) {
			infoCache.Store(nc, cachedInfo{err: err, at: time.Now()})
		}
		return nil, err
	}
	infoCache.Range(func(k, _ any) bool {
		if k.(*nats.Conn).IsClosed() {
			infoCache.Delete(k)
		}
		return true
	})
	infoCache.Store(nc, cachedInfo{info: info, at: time.Now()})
	return info, nil
}

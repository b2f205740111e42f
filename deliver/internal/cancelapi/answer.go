package cancelapi

import (
	"cmp"
	"context"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
)

// keptAnswer looks up the kept answer of each of keys (an id's readings)
// in scope ("" for any target); ok is false if none has one. Two keys
// with an answer make the id ambiguous, as in the index.
func (a *worker) keptAnswer(ctx context.Context, keys []string, scope, id string) (ans index.Answer, ok bool, err error) {
	if !a.cfg.KeepAnswers {
		return index.Answer{}, false, nil
	}
	for _, key := range keys {
		lctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
		got, found, err := index.LookupAnswer(lctx, a.readConn(), key)
		cancel()
		if err != nil {
			return index.Answer{}, false, err
		}
		if !found || (scope != "" && got.Target != scope) {
			continue
		}
		if ok {
			return index.Answer{}, false, ambiguous(id)
		}
		ans, ok = got, true
	}
	return ans, ok, nil
}

// readConn is the connection for index and answer reads:
// [Config].LookupConn if set.
func (a *worker) readConn() *nats.Conn { return cmp.Or(a.cfg.LookupConn, a.cfg.Conn) }

package cancelapi

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/deliver/internal/index"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/resource"
)

// idKeys returns the index keys id may name: as a publisher's id, and as
// what its form says (a sequence, "seq:"/"id:" and the rest, or a
// delivered id's sequence). None for an empty id.
//
// A delivered id names its sequence only if its ingress part is the life
// of DELAYD_INGRESS now: the same sequence in another life (the stream
// deleted and created again) is another message, which a cancel must not
// touch (docs/guide.md#what-the-target-receives). The life is read from
// the stream for each delivered id, never cached: a cached one would
// still match an old life's ids after the stream was created again.
// (Ingress partitions share the one stream and its sequences, so a
// delivered id of any partition names one message.)
func (a *worker) idKeys(ctx context.Context, id string) ([]string, error) {
	if id == "" {
		return nil, nil
	}
	keys := []string{index.UserKey(id)}
	if rest, ok := strings.CutPrefix(id, "seq:"); ok {
		if n, err := strconv.ParseUint(rest, 10, 64); err == nil {
			keys = append(keys, index.SeqKey(n))
		}
	} else if rest, ok := strings.CutPrefix(id, "id:"); ok && rest != "" {
		keys = append(keys, index.UserKey(rest))
	} else if n, err := strconv.ParseUint(id, 10, 64); err == nil {
		keys = append(keys, index.SeqKey(n))
	} else if life, seq, ok := a.cfg.HopKey.DeliveredSeq(id); ok {
		now, err := a.ingressLife(ctx)
		if err != nil {
			return nil, err
		}
		if life == now {
			keys = append(keys, index.SeqKey(seq))
		}
	}
	return keys, nil
}

// ingressLife returns the life of DELAYD_INGRESS now: its creation time,
// Unix ns in decimal, as the router's ingressRef writes it; "" if the
// stream does not exist.
func (a *worker) ingressLife(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, jswire.OpTimeout)
	defer cancel()
	str, err := a.cfg.JS.Stream(ctx, resource.IngressStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("stream %s: %w", resource.IngressStream, err)
	}
	return strconv.FormatInt(str.CachedInfo().Created.UnixNano(), 10), nil
}

package routing

import (
	"cmp"
	"context"
	"errors"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/message"
	"github.com/delayd/delayd/deliver/internal/ownership"
)

// Epoch markers (docs/guarantees.md#epoch-markers).
//
// A router that takes the router lease writes, before its first level
// write of the term, one marker to every level stream it writes: a
// message with no payload on the level's marker subject, carrying its
// lease epoch, written with Nats-Expected-Last-Sequence at the tail it
// synced. A stale router's write still in flight, or sent after a pause,
// expects an older last sequence, so the server refuses it; and the
// stale router's resync finds the newer epoch and stops the router
// (errRouterFenced) instead of taking its refused message for one a
// newer router stored. Every reader of level streams skips markers: the
// scanners pass them without delivering them, the tail sync walks back
// over them (a marker carries the ingress reference of the level's last
// router write before it, since the scanners may purge everything else),
// the re-index and the cancel paths never find one under an index key.

// markerTarget is the target part of the marker subject
// "delayd.level.<level name>.delayd.router.epoch". It lies under delayd's
// internal subjects, which no target may ([contract.ValidateTarget]), so
// no level message of a publisher's can have the marker subject.
const markerTarget = contract.InternalPrefix + ".router.epoch"

// markerSubject returns the marker subject of the level named name.
func markerSubject(name string) string {
	return contract.LevelSubjectPrefix + name + "." + markerTarget
}

// isMarkerMsg reports whether m, as read by direct get (its subject in the
// Nats-Subject header) or from a consumer (its own subject), is a marker.
func isMarkerMsg(m *nats.Msg) bool {
	if s := m.Header.Get(message.HdrJSSubject); s != "" {
		return message.IsMarker(s)
	}
	return message.IsMarker(m.Subject)
}

// markerEpoch returns the epoch a marker carries; false if it carries none
// that parses.
func markerEpoch(h nats.Header) (uint64, bool) {
	e, err := strconv.ParseUint(h.Get(message.HdrRouterEpoch), 10, 64)
	return e, err == nil
}

// markerLease returns the key of the lease whose epoch a marker carries:
// [ownership.RouterKey] unless it names another (the router of an
// ingress partition, "router.<i>").
func markerLease(h nats.Header) string {
	return cmp.Or(h.Get(message.HdrRouterLease), ownership.RouterKey)
}

// errRouterFenced ends a router's term: a router of a newer term wrote a
// level stream (its epoch marker, or messages past this router's last
// write). This router acks nothing more and stops until it takes the lease
// again.
var errRouterFenced = errors.New("a router of a newer term writes the level streams (fenced)")

// wrongLastSeq reports whether err is the server's refusal of a write
// whose Nats-Expected-Last-Sequence was not the stream's last sequence
// (code 10071, or 10164 on a replicated stream).
func wrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// checkMarker is [tailSync.readMarker] on the router's goroutine: this
// term's own marker marks the level as done for the term.
func (r *Router) checkMarker(ctx context.Context, w *levelWriter) error {
	own, err := r.tailSync(w).readMarker(ctx)
	if own {
		w.marked = r.run.term.Epoch
	}
	r.countFence(w, err)
	return err
}

// countFence counts err in w's fenced writes if it is a fence. Only the
// router's goroutine counts, when the fence ends its session: level syncs
// that meet the same fence at once count it once.
func (r *Router) countFence(w *levelWriter, err error) {
	if errors.Is(err, errRouterFenced) {
		w.fenced.Add(1)
	}
}

// markerMsg returns this term's epoch marker for w's level stream, to be
// written at the tail the level's sync found (applySync): a marker refused
// because the stream moved since makes the level sync again, and find a
// newer router's marker if that is what moved it.
func (r *Router) markerMsg(w *levelWriter) *nats.Msg {
	h := nats.Header{message.HdrRouterEpoch: {strconv.FormatUint(r.run.term.Epoch, 10)}, jetstream.ExpectedLastSeqHeader: {strconv.FormatUint(w.expected, 10)}}
	if key := r.LeaseKey(); key != ownership.RouterKey {
		h[message.HdrRouterLease] = []string{key}
	}
	if w.tailRef != "" {
		h[message.HdrRouterTail] = []string{w.tailRef}
	}
	return &nats.Msg{Subject: w.marker, Header: h}
}

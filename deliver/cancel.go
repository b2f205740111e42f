package deliver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/levels"
)

// How long a cancel waits for the router to place the messages published
// before it (or a cascading message between two levels) before it gives up
// with [ErrRouterBehind].
const cancelWaitRouted = 25 * time.Second

// cancelAnswer is a scanner's decision on a cancel.
type cancelAnswer int

const (
	answerCancelled cancelAnswer = iota // pending: now never delivered
	answerDelivered                     // handed to its target already
	answerForwarded                     // moved on to its next level: look again
	answerGone                          // no such message at that sequence
	answerRetry                         // not stored yet: look again
)

type cancelReq struct {
	rec   indexRecord
	reply chan cancelResult
}

type cancelResult struct {
	answer cancelAnswer
	err    error
}

// tombstone is a cancelled level message's record in [CancelStream]:
// "<level seq>\n<index key>\n<merge index key>".
type tombstone struct {
	seq      uint64
	key      string // the message's index key, checked when the scanner reaches it
	mergeKey string // its merge key's index key, "" if none
	target   string // its target subject (not encoded: known when cancelled, else from the index)
	at       uint64 // the tombstone's sequence in CancelStream
	indexed  bool   // its "cancelled" index records are written
	dropping bool   // handed to the janitor
}

func (t *tombstone) encode() []byte {
	return []byte(strconv.FormatUint(t.seq, 10) + "\n" + t.key + "\n" + t.mergeKey)
}

// clip quotes at most n bytes of b for a log line.
func clip(b []byte, n int) string {
	if len(b) > n {
		return strconv.Quote(string(b[:n])) + "…"
	}
	return strconv.Quote(string(b))
}

func decodeTombstone(data []byte, at uint64) (*tombstone, bool) {
	f := strings.SplitN(string(data), "\n", 3)
	if len(f) < 2 {
		return nil, false
	}
	seq, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil || f[1] == "" {
		return nil, false
	}
	t := &tombstone{seq: seq, key: f[1], at: at}
	if len(f) == 3 {
		t.mergeKey = f[2]
	}
	return t, true
}

// requestCancel asks the scanner's goroutine to cancel the message rec
// places in its stream. The decision is made there, between deliveries, so
// a message is either handed to its target or cancelled, never both.
func (s *Scanner) requestCancel(ctx context.Context, rec indexRecord) (cancelAnswer, error) {
	req := cancelReq{rec: rec, reply: make(chan cancelResult, 1)}
	select {
	case s.cancels <- req:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	s.nudge()
	select {
	case res := <-req.reply:
		return res.answer, res.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// nudge wakes the scanner from a wait.
func (s *Scanner) nudge() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// serveCancels decides the queued cancel requests.
func (s *Scanner) serveCancels(ctx context.Context) {
	for {
		select {
		case req := <-s.cancels:
			a, err := s.decideCancel(ctx, req.rec)
			req.reply <- cancelResult{a, err}
		default:
			return
		}
	}
}

// decideCancel runs on the scanner's goroutine. A sequence below next has
// been handed off (delivered, or forwarded to its next level); so may have
// one retried after an ambiguous failure, or one that was due before a
// restart (delivered before a crash, its offset not committed): those
// answer as handed off and are delivered (again) as usual. Any other is
// pending: a durable tombstone makes the scanner skip it when it gets
// there, also after a restart.
func (s *Scanner) decideCancel(ctx context.Context, rec indexRecord) (cancelAnswer, error) {
	seq := rec.seq
	s.cancelMu.Lock()
	_, done := s.cancelled[seq]
	s.cancelMu.Unlock()
	if done {
		return answerCancelled, nil
	}
	handedOff := func() cancelAnswer {
		if rec.hop {
			return answerForwarded
		}
		return answerDelivered
	}
	_, confirmed := s.done[seq]
	_, unsure := s.unsure[seq]
	if seq < s.next || confirmed || unsure || s.attempts[seq] > 0 {
		return handedOff(), nil
	}
	// The record names a sequence the router predicted: check the message
	// there is the one asked for.
	rctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	buf, err := s.reader.Read(rctx, s.cfg.Stream, nil, seq, 1, 1)
	switch {
	case err != nil:
		return 0, err
	case len(buf) == 0:
		return answerRetry, nil // the level write is not stored yet
	case buf[0].Header.Get(hdrJSSequence) != strconv.FormatUint(seq, 10) || levelKey(buf[0].Header) != rec.key:
		return answerGone, nil
	}
	m := buf[0]
	if due, _ := LevelDue(m.Header); seq <= s.startTail && !due.After(s.startedAt.Add(time.Second)) {
		return handedOff(), nil // perhaps delivered before a crash
	}
	t := &tombstone{seq: seq, key: rec.key, target: strings.TrimPrefix(m.Header.Get(hdrJSSubject), s.subject)}
	if mk := m.Header.Get(hdrMerge); mk != "" {
		t.mergeKey = mergeKey(t.target, mk)
	}
	ack, err := s.js.PublishMsg(rctx, &nats.Msg{Subject: cancelSubjects + s.cfg.Stream, Data: t.encode()})
	if err != nil {
		return 0, fmt.Errorf("cancel tombstone: %w", err)
	}
	t.at = ack.Sequence
	s.cancelMu.Lock()
	s.cancelled[seq] = t
	s.tombMin = min(s.tombMin, seq)
	s.cancelMu.Unlock()
	s.cancelledN.Add(1)
	// Later cancels of this id answer from the index, also once the
	// tombstone is gone, and its merge key is free. (If this fails, the
	// janitor writes them before it deletes the tombstone.)
	t.indexed = s.writeGone(rctx, t) == nil
	s.logger.Debug("message cancelled", slog.Uint64("seq", seq), slog.String("key", rec.key[1:]))
	return answerCancelled, nil
}

// writeGone writes the "cancelled" index records of t, and tells the router
// its merge key is free.
func (s *Scanner) writeGone(ctx context.Context, t *tombstone) error {
	for _, key := range []string{t.key, t.mergeKey} {
		if key == "" {
			continue
		}
		if _, err := s.js.PublishMsg(ctx, indexRecord{key: key, gone: true, target: t.target}.msg()); err != nil {
			s.logger.Warn("id index write failed", slog.Any("error", err))
			return err
		}
	}
	if t.mergeKey != "" && s.cfg.mergeGone != nil {
		s.cfg.mergeGone(indexRecord{key: t.mergeKey, gone: true, target: t.target})
	}
	return nil
}

// skipCancelled reports whether the head at seq is cancelled, and if so
// passes it without delivering it.
func (s *Scanner) skipCancelled(m *nats.Msg, seq uint64) bool {
	s.cancelMu.Lock()
	t, ok := s.cancelled[seq]
	s.cancelMu.Unlock()
	if !ok {
		return false
	}
	if t.key != levelKey(m.Header) {
		// Not the message the tombstone was written for (a stream deleted
		// and recreated under it): it is delivered.
		s.logger.Warn("cancel tombstone does not match the message at its sequence; delivering", slog.Uint64("seq", seq))
		return false
	}
	s.head = nil
	s.next = seq + 1
	s.passed.Store(seq)
	s.inflight = append(s.inflight, delivery{seq: seq, confirmed: true})
	return true
}

// loadTombstones reads the level's tombstones at start. Those the offset
// has passed go to the janitor; the rest are skipped when reached.
func (s *Scanner) loadTombstones(ctx context.Context, offset uint64) error {
	s.cancelMu.Lock()
	clear(s.cancelled)
	s.tombMin = math.MaxUint64
	s.cancelMu.Unlock()
	err := s.reader.EachOnSubject(ctx, CancelStream, cancelSubjects+s.cfg.Stream, s.cfg.Batch, opTimeout, func(m *nats.Msg, at uint64) {
		t, ok := decodeTombstone(m.Data, at)
		if !ok {
			// Not one delayd wrote: it cancels nothing and stays until an
			// operator removes it (README "State in NATS").
			s.logger.Warn("cancel tombstone not readable; ignored", slog.String("tombstones", CancelStream),
				slog.Uint64("tombstone_seq", at), slog.String("value", clip(m.Data, 64)))
			return
		}
		s.cancelMu.Lock()
		s.cancelled[t.seq] = t // indexed unknown: the janitor checks
		s.tombMin = min(s.tombMin, t.seq)
		s.cancelMu.Unlock()
	})
	if err != nil {
		return fmt.Errorf("cancel tombstones: %w", err)
	}
	s.dropTombstones(offset)
	return nil
}

// dropTombstones hands the tombstones the acknowledged offset has passed
// to the janitor, which deletes them: from then on they cost nothing.
func (s *Scanner) dropTombstones(acked uint64) {
	s.cancelMu.Lock()
	defer s.cancelMu.Unlock()
	if acked < s.tombMin {
		return
	}
	s.tombMin = math.MaxUint64
	for seq, t := range s.cancelled {
		if seq <= acked && !t.dropping {
			select {
			case s.janitor <- t:
				t.dropping = true
				continue
			default: // the janitor is behind: next time
			}
		}
		if !t.dropping {
			s.tombMin = min(s.tombMin, seq)
		}
	}
}

// runJanitor deletes the tombstones dropTombstones hands it, off the
// scanner's goroutine. Before a tombstone goes, its message's "cancelled"
// index records must be written (unless a later placement of the same id
// is the latest record by now), so a later cancel still answers cancelled.
func (s *Scanner) runJanitor(ctx context.Context) {
	reader, err := jswire.NewBatchReader(s.nc, indexBatch)
	if err != nil {
		s.logger.Error("cancel tombstone janitor", slog.Any("error", err))
		return
	}
	defer reader.Close()
	for {
		var t *tombstone
		select {
		case <-ctx.Done():
			return
		case t = <-s.janitor:
		}
		jctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		err := s.retire(jctx, reader, t)
		cancel()
		s.cancelMu.Lock()
		if err == nil {
			delete(s.cancelled, t.seq)
		} else {
			t.dropping = false
			s.tombMin = min(s.tombMin, t.seq)
			s.logger.Warn("cancel tombstone not deleted; retrying later", slog.Uint64("seq", t.seq), slog.Any("error", err))
		}
		s.cancelMu.Unlock()
	}
}

// retire writes t's missing index records and deletes the tombstone.
func (s *Scanner) retire(ctx context.Context, reader *jswire.BatchReader, t *tombstone) error {
	if !t.indexed {
		for _, key := range []string{t.key, t.mergeKey} {
			if key == "" {
				continue
			}
			latest, ok, err := lookupIndex(ctx, reader, key)
			if err != nil {
				return err
			}
			if ok && !latest.gone && (latest.stream != s.cfg.Stream || latest.seq != t.seq) {
				continue // the id or key was placed again since: that placement is not cancelled
			}
			if !ok || !latest.gone {
				target := t.target // known if cancelled by this process, else the placement's
				if target == "" {
					target = latest.target
				}
				if _, err := s.js.PublishMsg(ctx, indexRecord{key: key, gone: true, target: target}.msg()); err != nil {
					return err
				}
			}
		}
		t.indexed = true
	}
	if err := s.tombstones.DeleteMsg(ctx, t.at); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return err
	}
	return nil
}

// pendingAt reports whether the message rec places in this level has not
// been handed to its target and is not cancelled; a cascading message
// forwarded to its next level counts as pending until its due time (a
// cancel of it on its next level writes a newer "cancelled" record). The
// router calls it to merge; the answer may be overtaken by the scanner at
// once, which is the merge's semantics: the later message arrived while the
// first was pending.
func (s *Scanner) pendingAt(rec indexRecord) bool {
	s.cancelMu.Lock()
	_, cancelled := s.cancelled[rec.seq]
	s.cancelMu.Unlock()
	switch {
	case cancelled:
		return false
	case rec.seq > s.passed.Load():
		return true
	default:
		// By the server's clock; erring towards "not pending", which costs
		// a merge, never a message merged into one already delivered.
		return rec.hop && rec.due.After(s.srv.upper())
	}
}

// CancelStats counts the cancel API's answers.
type CancelStats struct {
	Cancelled, NotFound, AlreadyDelivered uint64
}

// serveCancel answers cancel requests on [contract.CancelSubject] until ctx is done,
// cancelWorkers at a time (one request waiting for the router does not hold
// up the others; each decision is still made by the owning scanner). Each
// costs an ingress stream info, an index lookup (one slot's records), a
// direct get and a tombstone write.
func (s *Service) serveCancel(ctx context.Context, js jetstream.JetStream, subs []*nats.Subscription, ch <-chan *nats.Msg) error {
	defer func() {
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}()
	var readers []*jswire.BatchReader
	for range cancelWorkers {
		reader, err := jswire.NewBatchReader(s.nc, indexBatch)
		if err != nil {
			for _, r := range readers {
				r.Close()
			}
			return err
		}
		readers = append(readers, reader)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, reader := range readers {
		wg.Go(func() {
			defer reader.Close()
			for {
				select {
				case <-ctx.Done():
					return
				case m := <-ch:
					// The scoped form's target; "" for the unscoped form.
					scope, scoped := strings.CutPrefix(m.Subject, contract.CancelSubject+".")
					if !scoped {
						scope = ""
					}
					var (
						reply string
						err   error
					)
					if scoped && scope == "" {
						s.cancelNotFound.Add(1)
						reply = contract.CancelReplyNotFound
					} else {
						reply, err = s.cancel(ctx, js, reader, string(m.Data), scope)
					}
					if err != nil {
						if ctx.Err() != nil {
							return
						}
						s.logger.Warn("cancel failed", slog.String("id", string(m.Data)), slog.Any("error", err))
						reply = contract.CancelReplyErrorPrefix + err.Error()
					}
					_ = m.RespondMsg(cancelReplyMsg(reply, err))
				}
			}
		})
	}
	<-ctx.Done()
	return nil
}

const cancelWorkers = 4

// subscribeCancel subscribes to [contract.CancelSubject] and the scoped
// "delayd.api.cancel.>" ([contract.CancelSubjectFor]), queue group "delayd", and
// waits until the server has the subscriptions, so a request sent once the
// service is ready finds a responder.
func (s *Service) subscribeCancel(ctx context.Context) ([]*nats.Subscription, chan *nats.Msg, error) {
	ch := make(chan *nats.Msg, 1024)
	var subs []*nats.Subscription
	for _, subject := range []string{contract.CancelSubject, contract.CancelSubject + ".>"} {
		sub, err := s.nc.ChanQueueSubscribe(subject, "delayd", ch)
		if err != nil {
			for _, sub := range subs {
				_ = sub.Unsubscribe()
			}
			return nil, nil, fmt.Errorf("subscribe %s: %w", subject, err)
		}
		subs = append(subs, sub)
	}
	fctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := s.nc.FlushWithContext(fctx); err != nil {
		// Disconnected: the client subscribes again when it reconnects.
		s.logger.Warn("cancel API subscription not confirmed yet", slog.Any("error", err))
	}
	return subs, ch, nil
}

// cancel decides one cancel request. The id is a publisher's Nats-Msg-Id
// or an ingress sequence: a decimal id is whichever of the two delayd
// knows. "seq:N" names ingress sequence N, "id:X" the publisher's id X —
// unless a publisher's id is that text itself. An id with two readings
// that both name a message is refused with [ErrAmbiguousID].
//
// scope is the target of a scoped request (delayd.api.cancel.<target>), ""
// for the unscoped one: a message with another target is treated exactly
// as an unknown id (it is not found, and it does not make an id ambiguous),
// so a scoped request tells nothing about other targets' messages.
func (s *Service) cancel(ctx context.Context, js jetstream.JetStream, reader *jswire.BatchReader, id, scope string) (string, error) {
	id = strings.TrimSpace(id)
	var keys []string
	if id != "" {
		// Every reading of the id: as a publisher's id, and as what its
		// form says (a sequence, or "seq:"/"id:" with the rest).
		keys = []string{userKey(id)}
		if rest, ok := strings.CutPrefix(id, "seq:"); ok {
			if n, err := strconv.ParseUint(rest, 10, 64); err == nil {
				keys = append(keys, seqKey(n))
			}
		} else if rest, ok := strings.CutPrefix(id, "id:"); ok && rest != "" {
			keys = append(keys, userKey(rest))
		} else if n, err := strconv.ParseUint(id, 10, 64); err == nil {
			keys = append(keys, seqKey(n))
		}
	}
	if len(keys) == 0 {
		s.cancelNotFound.Add(1)
		return contract.CancelReplyNotFound, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*cancelWaitRouted)
	defer cancel()
	// A message published before this request is in the ingress stream at
	// or below its last sequence; once the router has acked everything up
	// to there, its index record is readable.
	caughtUp, err := waitRouted(ctx, js, s.refused.routerWaiting)
	if err != nil {
		return "", err
	}
	var (
		rec  indexRecord
		ok   bool
		seen uint64
	)
	for _, key := range keys {
		r, found, err := lookupIndex(ctx, reader, key)
		if err != nil {
			return "", err
		}
		if found {
			if found, err = s.inScope(ctx, reader, r, scope); err != nil {
				return "", err
			}
		}
		if found && ok {
			return "", fmt.Errorf("%w %q: it names two messages (a publisher's Nats-Msg-Id, and an ingress sequence or a prefixed id); send seq:N for ingress sequence N, id:X for the publisher's id X", ErrAmbiguousID, id)
		}
		if found {
			rec, ok = r, true
		}
	}
	if !ok && !caughtUp {
		return "", ErrRouterBehind
	}
	deadline := time.Now().Add(cancelWaitRouted)
	pause := 2 * time.Millisecond
	for {
		if ok && rec.gone {
			s.cancelCancelled.Add(1)
			return contract.CancelReplyCancelled, nil // cancelled before
		}
		if !ok || rec.stream == "" {
			s.cancelNotFound.Add(1)
			return contract.CancelReplyNotFound, nil
		}
		if rec.at > seen {
			s.mu.Lock()
			sc := s.scanners[rec.stream]
			s.mu.Unlock()
			if sc == nil {
				s.cancelNotFound.Add(1)
				return contract.CancelReplyNotFound, nil
			}
			answer, err := sc.requestCancel(ctx, rec)
			if err != nil {
				return "", err
			}
			switch answer {
			case answerCancelled:
				s.cancelCancelled.Add(1)
				return contract.CancelReplyCancelled, nil
			case answerDelivered:
				s.cancelDelivered.Add(1)
				return contract.CancelReplyDelivered, nil
			case answerGone:
				s.cancelNotFound.Add(1)
				return contract.CancelReplyNotFound, nil
			case answerForwarded:
				seen = rec.at
			case answerRetry: // the level write is not stored yet: ask again
			}
		}
		// Between two levels: wait for the router to place it.
		if time.Now().After(deadline) {
			return "", ErrRouterBehind
		}
		if err := sleepCtx(ctx, pause); err != nil {
			return "", err
		}
		pause = min(2*pause, 100*time.Millisecond)
		if rec, ok, err = lookupIndex(ctx, reader, rec.key); err != nil {
			return "", err
		}
		if ok {
			if ok, err = s.inScope(ctx, reader, rec, scope); err != nil {
				return "", err
			}
		}
	}
}

// inScope reports whether rec's message has the target scope; every
// message is in the unscoped form's scope "". A record without a target
// (written before records carried it) is checked against the level message
// it places; one that placed none (left delayd) is out of any scope.
func (s *Service) inScope(ctx context.Context, reader *jswire.BatchReader, rec indexRecord, scope string) (bool, error) {
	switch {
	case scope == "":
		return true, nil
	case rec.target != "":
		return rec.target == scope, nil
	case rec.stream == "":
		return false, nil
	}
	rctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	msgs, err := reader.Read(rctx, rec.stream, nil, rec.seq, 1, 1)
	if err != nil {
		return false, err
	}
	if len(msgs) == 0 || msgs[0].Header.Get(hdrJSSequence) != strconv.FormatUint(rec.seq, 10) || levelKey(msgs[0].Header) != rec.key {
		return false, nil
	}
	return msgs[0].Header.Get(hdrJSSubject) == levelSubjects+strings.TrimPrefix(rec.stream, levels.StreamPrefix)+"."+scope, nil
}

// waitRouted waits until the router has acked every ingress message up to
// the ingress stream's last sequence now, for at most cancelWaitRouted. It
// reports whether it got there. Invalid messages whose dead letter
// DELAYD_DLQ refuses stay in ingress (see Router.deferDeadLetter): when
// waiting() says every message left is one of them, it got there too.
func waitRouted(ctx context.Context, js jetstream.JetStream, waiting func() int) (bool, error) {
	stream, err := js.Stream(ctx, IngressStream)
	if err != nil {
		return false, fmt.Errorf("ingress stream: %w", err)
	}
	upTo := stream.CachedInfo().State.LastSeq
	deadline := time.Now().Add(cancelWaitRouted)
	for wait := 2 * time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		st := stream.CachedInfo().State
		if st.Msgs == 0 || st.FirstSeq > upTo || st.Msgs <= uint64(waiting()) {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		if err := sleepCtx(ctx, wait); err != nil {
			return false, err
		}
		if _, err := stream.Info(ctx); err != nil {
			return false, fmt.Errorf("ingress stream: %w", err)
		}
	}
}

// CancelStats returns the cancel API's answers since start.
func (s *Service) CancelStats() CancelStats {
	return CancelStats{Cancelled: s.cancelCancelled.Load(), NotFound: s.cancelNotFound.Load(), AlreadyDelivered: s.cancelDelivered.Load()}
}

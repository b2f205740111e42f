package cancelapi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/jswire"
	"github.com/delayd/delayd/deliver/internal/level"
)

// enqueueList queues a list request for the list workers, or answers it
// busy at once when listQueueMax wait already (counted in counts). It runs
// on the subscription's goroutine.
func enqueueList(lists chan queued, counts *RequestCounts, m *nats.Msg) {
	select {
	case lists <- queued{m: m, at: time.Now()}:
	default:
		counts.count(errListBusy)
		_ = m.RespondMsg(listAnswer(errListBusy))
	}
}

// runLists starts the list workers on wg, each with a reader on rnc, until
// ctx is done (docs/guide.md#pending-messages).
func (a *API) runLists(ctx context.Context, wg *sync.WaitGroup, rnc *nats.Conn) error {
	var readers []*jswire.BatchReader
	for range listWorkers {
		reader, err := jswire.NewBatchReader(rnc, listBatch)
		if err != nil {
			for _, r := range readers {
				r.Close()
			}
			return err
		}
		readers = append(readers, reader)
	}
	for _, reader := range readers {
		w, lists := &worker{a.env}, a.lists // this goroutine's
		wg.Go(func() {
			defer reader.Close()
			for {
				select {
				case <-ctx.Done():
					return
				case q := <-lists:
					w.serveList(ctx, reader, q)
				}
			}
		})
	}
	return nil
}

// serveList answers one list request: a [contract.PendingReply] as JSON
// with [contract.PendingStatusOK], or an error answer with the cancel
// API's codes.
func (a *worker) serveList(ctx context.Context, reader *jswire.BatchReader, q queued) {
	m := q.m
	target := strings.TrimPrefix(m.Subject, contract.PendingSubject+".")
	reply, err := a.List(ctx, reader, target, m.Data, q.at.Add(listWait))
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		a.cfg.Lists.count(err)
		if !errors.Is(err, errBadList) && !errors.Is(err, level.ErrCancelBusy) {
			a.logger.Warn("list failed", slog.String("target", target), slog.Any("error", err))
		}
		_ = m.RespondMsg(listAnswer(err))
		return
	}
	data, err := json.Marshal(reply)
	a.cfg.Lists.count(err)
	if err != nil {
		_ = m.RespondMsg(listErrorMsg(err))
		return
	}
	_ = m.RespondMsg(&nats.Msg{Data: data, Header: nats.Header{contract.HeaderStatus: {strconv.Itoa(contract.PendingStatusOK)}}})
}

// List answers one list request for target with payload data (a
// [contract.PendingRequest] as JSON, or empty), reading with reader; the
// paced reads give up past notAfter with [level.ErrCancelBusy]. An error
// of the request's own making wraps errBadList (code 400).
func (a *worker) List(ctx context.Context, reader *jswire.BatchReader, target string, data []byte, notAfter time.Time) (contract.PendingReply, error) {
	q, err := parseList(target, cmp.Or(a.cfg.Prefix, contract.PrefixDefault), data)
	if err != nil {
		return contract.PendingReply{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*cancelWaitRouted)
	defer cancel()
	return a.walk(ctx, reader, q, notAfter)
}

// listAnswer is a list's error answer: [listErrorMsg], busy with the
// list's own text.
func listAnswer(err error) *nats.Msg {
	if errors.Is(err, level.ErrCancelBusy) {
		err = errListBusy // a list's busy answer, not the cancel queue's
	}
	return listErrorMsg(err)
}

// listErrorMsg is a list (or cancel-all) error answer: "error: " and the reason, with
// the cancel API's code (400 for the request's own fault).
func listErrorMsg(err error) *nats.Msg {
	switch {
	case errors.Is(err, errListBusy):
		err = errListBusy // the answer's text, not the path to it
	case errors.Is(err, level.ErrCancelBusy):
		err = level.ErrCancelBusy
	}
	m := replyMsg(contract.CancelReplyErrorPrefix+err.Error(), err)
	if errors.Is(err, errBadList) || errors.Is(err, errBadCancelAll) {
		m.Header.Set(contract.HeaderStatus, strconv.Itoa(contract.CancelStatusBadRequest))
	}
	return m
}

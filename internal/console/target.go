package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/levels"
)

// histogramMax is how many of a target's first pending messages the due-time histogram counts.
const histogramMax = 2 * delayd.PendingLimitMax

// pageSize is how many pending messages the target page lists.
const pageSize = 100

// target serves a target's pending messages (?subject=<target>[&cursor=…][&id=…]): a page of the list API, its
// first messages' due-time histogram, and a search by id (the status API, then the message's detail).
func (c *Console) target(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	subject, cursor := strings.TrimSpace(q.Get("subject")), q.Get("cursor")
	data := map[string]any{"Title": "Target " + subject, "Subject": subject}
	if id := strings.TrimSpace(q.Get("id")); id != "" {
		http.Redirect(w, r, messageURL(subject, id, false), http.StatusSeeOther)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
	defer cancel()
	page, err := delayd.ListPending(ctx, c.nc, subject, delayd.WithLimit(pageSize), delayd.WithCursor(cursor))
	if err != nil {
		data["Error"] = err.Error()
		c.render(w, r, http.StatusBadGateway, "target.html", data)
		return
	}
	data["Page"], data["Cursor"] = page, cursor
	if cursor == "" {
		h, err := c.histogram(ctx, subject, page)
		if err != nil {
			data["Error"] = "histogram: " + err.Error()
		}
		data["Hist"] = h
	}
	c.render(w, r, http.StatusOK, "target.html", data)
}

// histogram reads up to histogramMax of the target's first pending messages (first is the first page) and counts
// them by due time.
func (c *Console) histogram(ctx context.Context, subject string, first *delayd.PendingPage) (*histogram, error) {
	dues := make([]time.Time, 0, len(first.Items))
	for _, m := range first.Items {
		dues = append(dues, m.Due)
	}
	for next := first.Next; next != "" && len(dues) < histogramMax; {
		p, err := delayd.ListPending(ctx, c.nc, subject, delayd.WithLimit(delayd.PendingLimitMax), delayd.WithCursor(next))
		if err != nil {
			return newHistogram(dues, first.Total), err
		}
		for _, m := range p.Items {
			dues = append(dues, m.Due)
		}
		next = p.Next
	}
	return newHistogram(dues, first.Total), nil
}

// messageURL is the detail page of the message id pending for subject.
func messageURL(subject, id string, payload bool) string {
	v := url.Values{"subject": {subject}, "id": {id}}
	if payload {
		v.Set("payload", "1")
	}
	return "/console/message?" + v.Encode()
}

// message serves one pending message's detail (?subject=&id=[&payload=1]): its state (the status API) and, while
// it is pending, its list API item, found among the messages due at its due; the payload only on request.
func (c *Console) message(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	subject, id, withPayload := q.Get("subject"), q.Get("id"), q.Get("payload") == "1"
	data := map[string]any{"Title": "Message " + id, "Subject": subject, "ID": id, "WithPayload": withPayload,
		"PayloadURL": messageURL(subject, id, true)}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
	defer cancel()
	st, err := delayd.Status(ctx, c.nc, subject, id)
	if err != nil {
		data["Error"] = err.Error()
		c.render(w, r, http.StatusBadGateway, "message.html", data)
		return
	}
	data["State"] = string(st.State)
	if st.State != delayd.Pending {
		c.render(w, r, http.StatusOK, "message.html", data)
		return
	}
	m, err := c.find(ctx, subject, id, st.DueAt, withPayload)
	if err != nil {
		data["Error"] = err.Error()
	}
	if m != nil {
		data["Msg"] = m
		if withPayload {
			data["Payload"], data["PayloadNote"] = payloadText(m.Data)
		}
	}
	c.render(w, r, http.StatusOK, "message.html", data)
}

// find returns the pending message id of subject, due at due, from the list API; nil if it is no longer listed.
func (c *Console) find(ctx context.Context, subject, id string, due time.Time, payload bool) (*delayd.PendingMsg, error) {
	opts := []delayd.PendingOpt{delayd.WithDueAfter(due.Add(-time.Millisecond)), delayd.WithDueBefore(due.Add(time.Millisecond)), delayd.WithLimit(delayd.PendingLimitMax)}
	if payload {
		opts = append(opts, delayd.WithPayload())
	}
	for cursor, pages := "", 0; pages < 10; pages++ {
		p, err := delayd.ListPending(ctx, c.nc, subject, append(opts, delayd.WithCursor(cursor))...)
		if err != nil {
			return nil, err
		}
		for i := range p.Items {
			if p.Items[i].ID == id {
				return &p.Items[i], nil
			}
		}
		if cursor = p.Next; cursor == "" {
			break
		}
	}
	return nil, nil
}

// payloadText returns data as text when it is UTF-8, else as a quoted Go string, with a note saying which.
func payloadText(data []byte) (string, string) {
	if utf8.Valid(data) {
		return string(data), fmt.Sprintf("%d bytes, UTF-8 text", len(data))
	}
	return strconv.Quote(string(data)), fmt.Sprintf("%d bytes, not UTF-8: shown as a quoted Go string", len(data))
}

// result renders an action's outcome: what was asked and delayd's answer, as text.
func (c *Console) result(w http.ResponseWriter, r *http.Request, what, subject, id, answer string, err error) {
	data := map[string]any{"Title": what, "What": what, "Subject": subject, "ID": id, "Answer": answer, "Back": messageURL(subject, id, false)}
	status := http.StatusOK
	if err != nil {
		data["Error"] = err.Error()
		status = http.StatusBadGateway
	}
	c.render(w, r, status, "result.html", data)
}

// cancel cancels the form's message (the scoped cancel API of its target, [delayd.Cancel]).
func (c *Console) cancel(w http.ResponseWriter, r *http.Request, by slog.Attr) {
	subject, id := r.PostFormValue("subject"), r.PostFormValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.RequestTimeout)
	defer cancel()
	res, err := delayd.Cancel(ctx, c.nc, subject, id)
	c.logger.Info("console action", slog.String("action", "cancel"), slog.String("target", subject), slog.String("id", id),
		slog.String("answer", string(res)), errAttr(err), by)
	c.result(w, r, "Cancel", subject, id, string(res), err)
}

// reschedule moves the form's message: in (a duration from now, as Delay-Duration takes it) or at (RFC 3339).
func (c *Console) reschedule(w http.ResponseWriter, r *http.Request, by slog.Attr) {
	subject, id := r.PostFormValue("subject"), r.PostFormValue("id")
	in, at := strings.TrimSpace(r.PostFormValue("in")), strings.TrimSpace(r.PostFormValue("at"))
	h := nats.Header{}
	switch {
	case in != "" && at == "":
		d, err := levels.ParseDuration(in) // Delay-Duration's grammar: units ms s m h d
		if err != nil || d < 0 {
			c.result(w, r, "Reschedule", subject, id, "", fmt.Errorf("in %q: want a duration >= 0 with units ms, s, m, h or d, such as 90s, 2h or 1d", in))
			return
		}
		h.Set(contract.HeaderDuration, levels.FormatDuration(d))
	case at != "" && in == "":
		t, err := time.Parse(time.RFC3339Nano, at)
		if err != nil {
			c.result(w, r, "Reschedule", subject, id, "", fmt.Errorf("at %q: want an RFC 3339 time, such as 2026-01-02T15:04:05Z", at))
			return
		}
		h.Set(contract.HeaderDeliverAt, t.UTC().Format(time.RFC3339Nano))
	default:
		c.result(w, r, "Reschedule", subject, id, "", errors.New("give either in (a duration) or at (a time)"))
		return
	}
	c.move(w, r, "reschedule", subject, id, h, by)
}

// runNow reschedules the form's message to now: a delay of 0s delivers it at once.
func (c *Console) runNow(w http.ResponseWriter, r *http.Request, by slog.Attr) {
	h := nats.Header{}
	h.Set(contract.HeaderDuration, "0s")
	c.move(w, r, "run now", r.PostFormValue("subject"), r.PostFormValue("id"), h, by)
}

// move asks the reschedule API of subject (docs/pending.md#2-reschedule) to move id with the delay in h, and shows
// its answer as delayd gave it: "rescheduled" with the new due, "not found", "already delivered", or an error
// answer's text and code.
func (c *Console) move(w http.ResponseWriter, r *http.Request, what, subject, id string, h nats.Header, by slog.Attr) {
	answer, err := c.requestMove(r.Context(), subject, id, h)
	c.logger.Info("console action", slog.String("action", what), slog.String("target", subject), slog.String("id", id),
		slog.String("delay", headerText(h)), slog.String("answer", answer), errAttr(err), by)
	c.result(w, r, strings.ToUpper(what[:1])+what[1:], subject, id, answer, err)
}

func (c *Console) requestMove(ctx context.Context, subject, id string, h nats.Header) (string, error) {
	if err := contract.ValidateTarget(subject, ""); err != nil {
		return "", fmt.Errorf("reschedule: %w", err)
	}
	if strings.TrimSpace(id) == "" {
		return "", errors.New("reschedule: empty id")
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	m, err := c.nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: contract.RescheduleSubjectFor(subject), Header: h, Data: []byte(id)})
	if err != nil {
		return "", fmt.Errorf("reschedule %q: %w", id, err)
	}
	code, _ := strconv.Atoi(m.Header.Get(contract.HeaderStatus))
	switch code {
	case contract.RescheduleStatusRescheduled:
		return fmt.Sprintf("%s (due %s)", m.Data, m.Header.Get(contract.HeaderDueAt)), nil
	case contract.CancelStatusNotFound, contract.CancelStatusDelivered:
		return string(m.Data), nil
	}
	return "", fmt.Errorf("reschedule answered %d %q", code, m.Data)
}

func headerText(h nats.Header) string {
	var parts []string
	for k, vs := range h {
		parts = append(parts, k+": "+strings.Join(vs, ","))
	}
	return strings.Join(parts, "; ")
}

func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.Attr{}
	}
	return slog.String("error", err.Error())
}

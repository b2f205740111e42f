package cancelapi

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver/internal/level"
)

// errBadList wraps a list request's errors that are the request's fault
// (code 400).
var errBadList = errors.New("bad request")

// listQuery is one parsed list request.
type listQuery struct {
	target        string // the scoped form's; "" in the operator form
	subject       string // the operator form's filter (wildcards); "" in the scoped form
	first         bool   // no cursor: the reply carries total and next_due
	limit         int
	after, before time.Time // exclusive bounds on due; zero: none
	payload       bool
	cur           listCursor
}

// listCursor is the position a page ends at, sent to the client as the
// reply's next (base64url of its JSON, opaque to clients): every item
// before (D, K) in (due, key) order was returned, and every item of
// stream s below S[s] was returned or is excluded
// (docs/pending.md#13-the-walk-top-k-by-final-due-with-a-per-stream-lower-bound).
type listCursor struct {
	D int64             `json:"d"`
	K string            `json:"k"`
	S map[string]uint64 `json:"s,omitempty"`
}

func (c listCursor) set() bool { return c.K != "" }

// after reports whether (due, key) comes after the cursor's position.
func (c listCursor) after(due time.Time, key string) bool {
	if !c.set() {
		return true
	}
	return cmp.Or(cmp.Compare(due.UnixNano(), c.D), strings.Compare(key, c.K)) > 0
}

func (c listCursor) encode() string {
	b, _ := json.Marshal(c) // cannot fail: numbers and strings
	return base64.RawURLEncoding.EncodeToString(b)
}

// errListBusy is a list's busy answer (code 429, as the cancel API's
// [level.ErrCancelBusy], which it matches with errors.Is): the list queue
// is full, or the walk could not get its reads in time.
var errListBusy error = listBusy{}

type listBusy struct{}

func (listBusy) Error() string        { return "busy: too many list requests waiting; try again" }
func (listBusy) Is(target error) bool { return target == level.ErrCancelBusy }

// parseList parses a request on "delayd.api.pending.<target>" (target ""
// for the operator form, on "delayd.api.pending"); prefix is the ingress
// prefix (a target under it is refused, as a publish to it is:
// [contract.ValidateTarget]). Its errors are in delayd's words, not
// encoding/json's: a field of the wrong type is named with the type it
// must have.
func parseList(target, prefix string, data []byte) (listQuery, error) {
	q := listQuery{target: target, limit: contract.PendingLimitDefault}
	if target != "" {
		if err := contract.ValidateTarget(target, prefix); err != nil {
			return q, fmt.Errorf("%w: %w", errBadList, err)
		}
	}
	// The fields whose JSON type a client may get wrong are read raw and
	// checked here; the rest by encoding/json.
	var req struct {
		Limit     json.RawMessage `json:"limit"`
		Cursor    string          `json:"cursor"`
		DueAfter  json.RawMessage `json:"due_after"`
		DueBefore json.RawMessage `json:"due_before"`
		Payload   bool            `json:"payload"`
		Subject   string          `json:"subject"`
	}
	if len(strings.TrimSpace(string(data))) > 0 {
		dec := json.NewDecoder(strings.NewReader(string(data)))
		dec.DisallowUnknownFields() // a misspelt option is refused, not ignored
		if err := dec.Decode(&req); err != nil {
			te, se := (*json.UnmarshalTypeError)(nil), (*json.SyntaxError)(nil)
			field, unknown := strings.CutPrefix(err.Error(), "json: unknown field ")
			switch {
			case errors.As(err, &te) && te.Field != "":
				return q, fmt.Errorf("%w: %s must be %s", errBadList, te.Field, jsonKind(te.Type.Kind()))
			case unknown:
				return q, fmt.Errorf("%w: unknown field %s (the fields are limit, cursor, due_after, due_before, payload, and subject in the operator form)", errBadList, field)
			case errors.As(err, &se):
				return q, fmt.Errorf("%w: payload is not JSON (at byte %d)", errBadList, se.Offset)
			}
			return q, fmt.Errorf("%w: payload is not a JSON object", errBadList)
		}
		if dec.More() {
			return q, fmt.Errorf("%w: payload is not a JSON list request: data after its JSON object", errBadList)
		}
	}
	if raw := req.Limit; len(raw) > 0 && string(raw) != "null" {
		n, err := strconv.Atoi(string(raw))
		switch {
		case err != nil && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9'):
			return q, fmt.Errorf("%w: limit must be a whole number in 1..%d", errBadList, contract.PendingLimitMax)
		case err != nil:
			return q, fmt.Errorf("%w: limit must be a number", errBadList)
		case n < 0 || n > contract.PendingLimitMax:
			return q, fmt.Errorf("%w: limit %d is not in 1..%d", errBadList, n, contract.PendingLimitMax)
		case n > 0:
			q.limit = n
		}
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		dst  *time.Time
	}{{"due_after", req.DueAfter, &q.after}, {"due_before", req.DueBefore, &q.before}} {
		if len(f.raw) == 0 || string(f.raw) == "null" {
			continue
		}
		var text string
		err := json.Unmarshal(f.raw, &text)
		if err == nil {
			*f.dst, err = time.Parse(time.RFC3339Nano, text)
		}
		if err != nil {
			return q, fmt.Errorf("%w: %s must be RFC 3339, e.g. 2026-12-03T09:00:00Z", errBadList, f.name)
		}
	}
	if req.Cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(req.Cursor)
		if err == nil {
			err = json.Unmarshal(b, &q.cur)
		}
		if err != nil {
			return q, fmt.Errorf("%w: cursor is not a next this API gave", errBadList)
		}
	}
	q.payload, q.first = req.Payload, req.Cursor == ""
	switch {
	case target != "" && req.Subject != "":
		return q, fmt.Errorf("%w: subject is the operator form's (%s); a request to %s lists %s only", errBadList, contract.PendingSubject, contract.PendingSubjectFor(target), target)
	case target == "":
		q.subject = cmp.Or(req.Subject, ">")
		if err := validFilter(q.subject); err != nil {
			return q, fmt.Errorf("%w: subject %q: %s", errBadList, q.subject, err)
		}
	}
	return q, nil
}

// jsonKind names a JSON field's expected type for an error answer.
func jsonKind(k reflect.Kind) string {
	switch k {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	}
	return "a number"
}

// validFilter checks the operator form's subject filter: NATS subject
// syntax, wildcards allowed ("*" as a whole token, ">" as the last).
func validFilter(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	toks := strings.Split(s, ".")
	for i, tok := range toks {
		switch {
		case tok == "":
			return errors.New("empty token")
		case strings.ContainsFunc(tok, func(r rune) bool { return r <= ' ' || r == 0x7f }):
			return errors.New("white space or control byte")
		case tok == ">" && i != len(toks)-1:
			return errors.New("'>' is not the last token")
		case len(tok) > 1 && strings.ContainsAny(tok, "*>"):
			return fmt.Errorf("wildcard inside token %q", tok)
		}
	}
	return nil
}

// subjectMatches reports whether the literal subject s matches filter.
func subjectMatches(filter, s string) bool {
	ft, st := strings.Split(filter, "."), strings.Split(s, ".")
	for i, f := range ft {
		switch {
		case f == ">":
			return len(st) > i
		case i >= len(st) || f != "*" && f != st[i]:
			return false
		}
	}
	return len(ft) == len(st)
}

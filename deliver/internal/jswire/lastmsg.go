package jswire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/hedge"
)

// LastOnSubject reads the headers and sequence of stream's last message on
// subject from the stream's leader: a message get ($JS.API.STREAM.MSG.GET
// with last_by_subj), which only the leader answers, not a direct get,
// which a replica behind the leader may answer. found is false (headers
// nil, seq 0) when the stream holds no message on subject. Errors, wrapped
// as "message get from <stream>: ...": the request's, the server's
// (a *[jetstream.APIError]), or a reply that does not decode.
func LastOnSubject(ctx context.Context, nc *nats.Conn, stream, subject string) (h nats.Header, seq uint64, found bool, err error) {
	req, _ := json.Marshal(struct {
		LastBySubject string `json:"last_by_subj"`
	}{subject})
	// Only the leader answers: sent again every hedge.AfterLeader, to
	// reach a new leader once one is elected if this one hangs.
	m, err := hedge.Do(ctx, hedge.AfterLeader, func(ctx context.Context) (*nats.Msg, error) {
		return nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	})
	if err != nil {
		return nil, 0, false, fmt.Errorf("message get from %s: %w", stream, err)
	}
	var resp struct {
		Error *jetstream.APIError `json:"error"`
		Msg   *struct {
			Seq uint64 `json:"seq"`
			Hdr []byte `json:"hdrs"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, 0, false, fmt.Errorf("message get from %s: %w", stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, 0, false, nil
	case resp.Error != nil:
		return nil, 0, false, fmt.Errorf("message get from %s: %w", stream, resp.Error)
	case resp.Msg == nil:
		return nil, 0, false, fmt.Errorf("message get from %s: %w", stream, errors.New("empty reply"))
	}
	h = nats.Header{}
	if len(resp.Msg.Hdr) > 0 {
		if h, err = nats.DecodeHeadersMsg(resp.Msg.Hdr); err != nil {
			return nil, 0, false, fmt.Errorf("message get from %s: headers: %w", stream, err)
		}
	}
	return h, resp.Msg.Seq, true, nil
}

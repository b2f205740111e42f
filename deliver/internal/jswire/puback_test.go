package jswire

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/internal/natstest"
)

// refParsePubAck reads a publish reply the way nats.go's async publish
// does (encoding/json into its response type).
func refParsePubAck(data []byte) (jetstream.PubAck, error) {
	var r pubAckResponse
	if err := json.Unmarshal(data, &r); err != nil {
		return jetstream.PubAck{}, jetstream.ErrInvalidJSAck
	}
	if r.Error != nil {
		return jetstream.PubAck{}, r.Error
	}
	if r.PubAck == nil || r.PubAck.Stream == "" {
		return jetstream.PubAck{}, jetstream.ErrInvalidJSAck
	}
	return *r.PubAck, nil
}

// TestParsePubAck: the server's PubAcks are read from their bytes (the
// flat path), anything else as encoding/json reads it: errors as
// *jetstream.APIError with their codes, replies without a stream as
// ErrInvalidJSAck.
func TestParsePubAck(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		in   string
		want jetstream.PubAck
		code jetstream.ErrorCode // the APIError's err_code; 0: none
		err  error               // a sentinel error; nil: none
		flat bool                // read by the flat path
	}{
		{name: "plain", in: `{"stream":"DELAYD_L_1S","seq":42}`, want: jetstream.PubAck{Stream: "DELAYD_L_1S", Sequence: 42}, flat: true},
		{name: "duplicate", in: `{"stream":"S","seq":7,"duplicate":true}`, want: jetstream.PubAck{Stream: "S", Sequence: 7, Duplicate: true}, flat: true},
		{name: "not duplicate", in: `{"stream":"S","seq":7,"duplicate":false}`, want: jetstream.PubAck{Stream: "S", Sequence: 7}, flat: true},
		{name: "domain", in: `{"stream":"S","domain":"hub","seq":1}`, want: jetstream.PubAck{Stream: "S", Sequence: 1, Domain: "hub"}, flat: true},
		{name: "counter value", in: `{"stream":"S","seq":3,"val":"12"}`, want: jetstream.PubAck{Stream: "S", Sequence: 3, Value: "12"}, flat: true},
		{name: "unknown fields skipped", in: `{"stream":"S","seq":3,"batch":"b1","count":2,"x":true}`, want: jetstream.PubAck{Stream: "S", Sequence: 3}, flat: true},
		{name: "white space", in: " {\n \"stream\" : \"S\" ,\t\"seq\" : 9 }\r\n", want: jetstream.PubAck{Stream: "S", Sequence: 9}, flat: true},
		{name: "max seq", in: `{"stream":"S","seq":18446744073709551615}`, want: jetstream.PubAck{Stream: "S", Sequence: 18446744073709551615}, flat: true},
		{name: "seq 0", in: `{"stream":"S","seq":0}`, want: jetstream.PubAck{Stream: "S"}, flat: true},
		{name: "escaped stream name", in: `{"stream":"A\u0042","seq":5}`, want: jetstream.PubAck{Stream: "AB", Sequence: 5}},
		{name: "no seq", in: `{"stream":"S"}`, want: jetstream.PubAck{Stream: "S"}},
		{name: "wrong last sequence", in: `{"type":"io.nats.jetstream.api.v1.pub_ack_response","error":{"code":400,"err_code":10071,"description":"wrong last sequence: 4"}}`, code: jetstream.JSErrCodeStreamWrongLastSequence},
		{name: "error and stream", in: `{"stream":"S","seq":1,"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`, code: 10077},
		{name: "no stream", in: `{"seq":5}`, err: jetstream.ErrInvalidJSAck},
		{name: "empty stream", in: `{"stream":"","seq":5}`, err: jetstream.ErrInvalidJSAck},
		{name: "empty object", in: `{}`, err: jetstream.ErrInvalidJSAck},
		{name: "empty", in: ``, err: jetstream.ErrInvalidJSAck},
		{name: "not json", in: `+OK`, err: jetstream.ErrInvalidJSAck},
		{name: "truncated", in: `{"stream":"S","seq":5`, err: jetstream.ErrInvalidJSAck},
		{name: "trailing bytes", in: `{"stream":"S","seq":5}x`, err: jetstream.ErrInvalidJSAck},
		{name: "seq overflows", in: `{"stream":"S","seq":18446744073709551616}`, err: jetstream.ErrInvalidJSAck},
		{name: "seq a string", in: `{"stream":"S","seq":"5"}`, err: jetstream.ErrInvalidJSAck},
		{name: "stream a number", in: `{"stream":5,"seq":5}`, err: jetstream.ErrInvalidJSAck},
		{name: "seq leading zero", in: `{"stream":"S","seq":05}`, err: jetstream.ErrInvalidJSAck},
		{name: "field name in another case", in: `{"stream":"S","seq":1,"SEQ":2}`, want: jetstream.PubAck{Stream: "S", Sequence: 2}},
		{name: "non-ASCII stream name", in: `{"stream":"Ä","seq":1}`, want: jetstream.PubAck{Stream: "Ä", Sequence: 1}},
		{name: "seq negative", in: `{"stream":"S","seq":-5}`, err: jetstream.ErrInvalidJSAck},
		// A known field of another kind fails encoding/json's reading (the
		// flat path must not read past it): each kind of value for each field.
		{name: "error a string", in: `{"stream":"S","seq":1,"error":"x"}`, err: jetstream.ErrInvalidJSAck},
		{name: "error a number", in: `{"stream":"S","seq":1,"error":5}`, err: jetstream.ErrInvalidJSAck},
		{name: "error a boolean", in: `{"stream":"S","seq":1,"error":true}`, err: jetstream.ErrInvalidJSAck},
		{name: "duplicate a string", in: `{"stream":"S","seq":1,"duplicate":"true"}`, err: jetstream.ErrInvalidJSAck},
		{name: "duplicate a number", in: `{"stream":"S","seq":1,"duplicate":1}`, err: jetstream.ErrInvalidJSAck},
		{name: "stream a boolean", in: `{"stream":true,"seq":1}`, err: jetstream.ErrInvalidJSAck},
		{name: "stream a boolean after a string", in: `{"stream":"S","seq":1,"stream":true}`, err: jetstream.ErrInvalidJSAck},
		{name: "stream a number after a string", in: `{"stream":"S","seq":1,"stream":5}`, err: jetstream.ErrInvalidJSAck},
		{name: "seq a boolean", in: `{"stream":"S","seq":true}`, err: jetstream.ErrInvalidJSAck},
		{name: "seq a boolean after a number", in: `{"stream":"S","seq":1,"seq":true}`, err: jetstream.ErrInvalidJSAck},
		{name: "seq a string after a number", in: `{"stream":"S","seq":1,"seq":"5"}`, err: jetstream.ErrInvalidJSAck},
		{name: "domain a number", in: `{"stream":"S","seq":1,"domain":5}`, err: jetstream.ErrInvalidJSAck},
		{name: "domain a boolean", in: `{"stream":"S","seq":1,"domain":false}`, err: jetstream.ErrInvalidJSAck},
		{name: "val a number", in: `{"stream":"S","seq":1,"val":12}`, err: jetstream.ErrInvalidJSAck},
		{name: "val a boolean", in: `{"stream":"S","seq":1,"val":true}`, err: jetstream.ErrInvalidJSAck},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePubAck([]byte(tt.in))
			var apiErr *jetstream.APIError
			switch {
			case tt.code != 0:
				if !errors.As(err, &apiErr) || apiErr.ErrorCode != tt.code {
					t.Fatalf("ParsePubAck(%s) = %+v, %v; want an APIError with err_code %d", tt.in, got, err, tt.code)
				}
			case tt.err != nil:
				if !errors.Is(err, tt.err) {
					t.Fatalf("ParsePubAck(%s) = %+v, %v; want %v", tt.in, got, err, tt.err)
				}
			default:
				if err != nil || got != tt.want {
					t.Fatalf("ParsePubAck(%s) = %+v, %v; want %+v", tt.in, got, err, tt.want)
				}
			}
			if _, flat := parseFlatPubAck([]byte(tt.in)); flat != tt.flat {
				t.Errorf("flat path took %s: %v, want %v", tt.in, flat, tt.flat)
			}
		})
	}
}

// FuzzParsePubAck: for any bytes, ParsePubAck answers what nats.go's
// encoding/json reading answers: the same PubAck, the same APIError code,
// or an error for both.
func FuzzParsePubAck(f *testing.F) {
	for _, s := range []string{
		`{"stream":"S","seq":42}`, `{"stream":"S","seq":7,"duplicate":true,"domain":"d"}`,
		`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 4"}}`,
		`{"stream":"S","seq":1,"x":[1,2]}`, `{"stream":"\u0053","seq":1}`, ` { "stream" : "S" , "seq" : 1 } `,
		`{"stream":"S","seq":1,"stream":"T"}`, `{"stream":"S","seq":1e3}`, `{"stream":"S","seq":01}`,
		`{"stream":"S","seq":1,"SEQ":2}`, "{\"stream\":\"\xff\",\"seq\":1}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := ParsePubAck(data)
		want, werr := refParsePubAck(data)
		if (err == nil) != (werr == nil) {
			t.Fatalf("ParsePubAck(%q) = %+v, %v; encoding/json: %+v, %v", data, got, err, want, werr)
		}
		if err == nil && got != want {
			t.Fatalf("ParsePubAck(%q) = %+v; encoding/json: %+v", data, got, want)
		}
		var a, b *jetstream.APIError
		if errors.As(err, &a) != errors.As(werr, &b) || (a != nil && a.ErrorCode != b.ErrorCode) {
			t.Fatalf("ParsePubAck(%q) error %v; encoding/json: %v", data, err, werr)
		}
	})
}

// wait returns f's outcome, failing the test if it is not known within a
// minute.
func wait(t *testing.T, f *PubAckFuture) (*jetstream.PubAck, error) {
	t.Helper()
	select {
	case <-f.Done():
		return f.Result()
	case <-time.After(time.Minute):
		t.Fatal("no outcome within a minute")
		return nil, nil
	}
}

// TestPubAcksOutcomes: writes to a real server through the tracker get
// their stream sequences in order, a write the stream refuses its
// APIError, a write to a subject no stream listens on
// ErrNoStreamResponse, and a write whose PubAck never comes (a core
// subscriber takes it and does not answer) ErrAsyncPublishTimeout after
// the timeout, while writes after it are answered. At Close a pending
// write resolves with ErrPubAcksClosed, and later writes fail with it.
func TestPubAcksOutcomes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.stream(t, "T")
	mute, err := b.nc.SubscribeSync("mute.>") // takes the write, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Unsubscribe()
	acks, err := NewPubAcks(b.nc, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer acks.Close()

	var futs []*PubAckFuture
	for i := range 100 {
		f, err := acks.Publish(&nats.Msg{Subject: "t.x", Data: []byte(strconv.Itoa(i))})
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, f)
	}
	for i, f := range futs {
		ack, err := wait(t, f)
		if err != nil || ack.Stream != "T" || ack.Sequence != uint64(i+1) {
			t.Fatalf("write %d: %+v, %v; want T sequence %d", i, ack, err, i+1)
		}
	}

	m := &nats.Msg{Subject: "t.x", Header: nats.Header{jetstream.ExpectedLastSeqHeader: {"7"}}}
	f, err := acks.Publish(m)
	if err != nil {
		t.Fatal(err)
	}
	if m.Reply != "" {
		t.Errorf("Publish left the reply subject %q on the message", m.Reply)
	}
	var apiErr *jetstream.APIError
	if _, err := wait(t, f); !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Errorf("write expecting last sequence 7 of 100: %v; want the wrong-last-sequence APIError", err)
	}

	f, err = acks.Publish(&nats.Msg{Subject: "nostream.x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wait(t, f); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("write to a subject without a stream: %v; want %v", err, jetstream.ErrNoStreamResponse)
	}

	lost, err := acks.Publish(&nats.Msg{Subject: "mute.x"})
	if err != nil {
		t.Fatal(err)
	}
	after, err := acks.Publish(&nats.Msg{Subject: "t.x"})
	if err != nil {
		t.Fatal(err)
	}
	if ack, err := wait(t, after); err != nil || ack.Sequence != 101 {
		t.Errorf("write after the unanswered one: %+v, %v; want T sequence 101", ack, err)
	}
	if _, err := wait(t, lost); !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
		t.Errorf("unanswered write: %v; want %v", err, jetstream.ErrAsyncPublishTimeout)
	}
	if n := acks.Pending(); n != 0 {
		t.Errorf("%d writes still pending after every outcome", n)
	}

	pending, err := acks.Publish(&nats.Msg{Subject: "mute.y"})
	if err != nil {
		t.Fatal(err)
	}
	acks.Close()
	if _, err := wait(t, pending); !errors.Is(err, ErrPubAcksClosed) {
		t.Errorf("write pending at Close: %v; want %v", err, ErrPubAcksClosed)
	}
	if _, err := acks.Publish(&nats.Msg{Subject: "t.x"}); !errors.Is(err, ErrPubAcksClosed) {
		t.Errorf("Publish after Close: %v; want %v", err, ErrPubAcksClosed)
	}
}

// TestPubAcksLostReply: a write whose reply is dropped (LoseReplies) is
// stored, and its future fails with ErrAsyncPublishTimeout; the writes
// around it are answered.
func TestPubAcksLostReply(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.stream(t, "T")
	acks, err := NewPubAcks(b.nc, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer acks.Close()
	acks.LoseReplies(func(n uint64) bool { return n == 2 })
	var futs []*PubAckFuture
	for range 3 {
		f, err := acks.Publish(&nats.Msg{Subject: "t.x"})
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, f)
	}
	for i, f := range futs {
		ack, err := wait(t, f)
		if i == 1 {
			if !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
				t.Errorf("write 2 (reply lost): %+v, %v; want %v", ack, err, jetstream.ErrAsyncPublishTimeout)
			}
			continue
		}
		if err != nil || ack.Sequence != uint64(i+1) {
			t.Errorf("write %d: %+v, %v; want sequence %d", i+1, ack, err, i+1)
		}
	}
	s, err := b.js.Stream(b.ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 3 {
		t.Errorf("T holds %d messages, want 3: the write whose reply was lost is stored too", n)
	}
}

// TestPubAcksLostLastReply: the newest write, with no write after it,
// whose reply is dropped still times out (the sweep reaches the last id
// given out; in TestPubAcksLostReply a later write follows the lost one).
func TestPubAcksLostLastReply(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.stream(t, "T")
	acks, err := NewPubAcks(b.nc, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer acks.Close()
	acks.LoseReplies(func(n uint64) bool { return n == 2 })
	for n := 1; n <= 2; n++ {
		f, err := acks.Publish(&nats.Msg{Subject: "t.x"})
		if err != nil {
			t.Fatal(err)
		}
		ack, err := wait(t, f)
		if n == 2 && !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
			t.Errorf("the last write, its reply lost: %+v, %v; want %v", ack, err, jetstream.ErrAsyncPublishTimeout)
		}
		if n == 1 && (err != nil && !errors.Is(err, jetstream.ErrAsyncPublishTimeout)) {
			t.Errorf("write 1: %v", err) // a PubAck slower than 200 ms under load times out: not what this test is about
		}
	}
	if n := acks.Pending(); n != 0 {
		t.Errorf("%d writes still pending", n)
	}
}

// TestPubAcksFailOnDisconnect: with FailOnDisconnect, a write pending
// when the connection starts reconnecting fails at once with
// nats.ErrDisconnected, as nats.go's async publish does, not after the
// timeout (ten minutes here: only the reconnect can resolve it within the
// test); a tracker not asked keeps its write pending. Both keep working
// after the reconnect (the reply subscription is resubscribed), and Close
// ends the watch.
func TestPubAcksFailOnDisconnect(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.stream(t, "T")
	mute, err := b.nc.SubscribeSync("mute.>") // takes the write, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Unsubscribe()
	acks, err := NewPubAcks(b.nc, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer acks.Close()
	acks.FailOnDisconnect()
	plain, err := NewPubAcks(b.nc, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()

	lost, err := acks.Publish(&nats.Msg{Subject: "mute.x"})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := plain.Publish(&nats.Msg{Subject: "mute.x"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := b.nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	if _, err := wait(t, lost); !errors.Is(err, nats.ErrDisconnected) {
		t.Fatalf("write pending at the reconnect: %v; want %v", err, nats.ErrDisconnected)
	}
	if n := acks.Pending(); n != 0 {
		t.Errorf("%d writes still pending after the reconnect", n)
	}

	// Both trackers answer writes after the reconnect.
	for i, tr := range []*PubAcks{acks, plain} {
		f, err := tr.Publish(&nats.Msg{Subject: "t.x"})
		if err != nil {
			t.Fatal(err)
		}
		if ack, err := wait(t, f); err != nil || ack.Stream != "T" || ack.Sequence != uint64(i+1) {
			t.Errorf("write %d after the reconnect: %+v, %v; want T sequence %d", i+1, ack, err, i+1)
		}
	}
	select {
	case <-kept.Done():
		r, err := kept.Result()
		t.Errorf("a tracker without FailOnDisconnect resolved its write at the reconnect: %+v, %v", r, err)
	default:
	}
	if n := plain.Pending(); n != 1 {
		t.Errorf("the tracker without FailOnDisconnect has %d writes pending, want 1", n)
	}
	acks.Close() // ends the watch: returns, and a later reconnect fails nothing
	plain.Close()
	if _, err := wait(t, kept); !errors.Is(err, ErrPubAcksClosed) {
		t.Errorf("write pending at Close: %v; want %v", err, ErrPubAcksClosed)
	}
	if err := b.nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
}

// TestPubAcksMaxPayload: a message larger than the server's max payload
// is refused by Publish itself (nats.ErrMaxPayload), and nothing stays
// pending.
func TestPubAcksMaxPayload(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	acks, err := NewPubAcks(b.nc, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer acks.Close()
	if _, err := acks.Publish(&nats.Msg{Subject: "t.x", Data: make([]byte, b.nc.MaxPayload()+1)}); !errors.Is(err, nats.ErrMaxPayload) {
		t.Errorf("oversized write: %v; want %v", err, nats.ErrMaxPayload)
	}
	if n := acks.Pending(); n != 0 {
		t.Errorf("%d writes pending after a refused Publish", n)
	}
	if _, err := NewPubAcks(b.nc, 0); err == nil {
		t.Error("NewPubAcks with timeout 0: no error")
	}
}

// BenchmarkParsePubAck measures reading one PubAck as the server sends
// it: with the flat reader, and with encoding/json (nats.go's way).
func BenchmarkParsePubAck(b *testing.B) {
	data := []byte(`{"stream":"DELAYD_L_1S","seq":1234567}`)
	b.Run("flat", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ParsePubAck(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := refParsePubAck(data); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkPublishPubAck measures one write to a stream and its PubAck,
// 256 in flight at a time, against an embedded server (memory storage):
// through the tracker, and through nats.go's async publish. Allocations
// count the server's too (in-process), the same for both.
func BenchmarkPublishPubAck(b *testing.B) {
	srv := natstest.Start(b, nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "B", Subjects: []string{"b.>"}, Storage: jetstream.MemoryStorage, MaxMsgs: 10000}); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 128)
	const window = 256
	b.Run("jswire", func(b *testing.B) {
		acks, err := NewPubAcks(nc, 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		defer acks.Close()
		futs := make([]*PubAckFuture, 0, window)
		m := &nats.Msg{Subject: "b.x", Data: data}
		b.ReportAllocs()
		for b.Loop() {
			f, err := acks.Publish(m)
			if err != nil {
				b.Fatal(err)
			}
			if futs = append(futs, f); len(futs) == window {
				for _, f := range futs {
					<-f.Done()
					if _, err := f.Result(); err != nil {
						b.Fatal(err)
					}
				}
				futs = futs[:0]
			}
		}
	})
	b.Run("nats.go", func(b *testing.B) {
		futs := make([]jetstream.PubAckFuture, 0, window)
		m := &nats.Msg{Subject: "b.x", Data: data}
		b.ReportAllocs()
		for b.Loop() {
			f, err := js.PublishMsgAsync(m)
			if err != nil {
				b.Fatal(err)
			}
			if futs = append(futs, f); len(futs) == window {
				for _, f := range futs {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						b.Fatal(err)
					}
				}
				futs = futs[:0]
			}
		}
	})
}

package jswire

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// seqs returns the Nats-Sequence of each message.
func seqs(t *testing.T, msgs []*nats.Msg) []uint64 {
	t.Helper()
	out := make([]uint64, len(msgs))
	for i, m := range msgs {
		n, err := strconv.ParseUint(m.Header.Get(HeaderSequence), 10, 64)
		if err != nil {
			t.Fatalf("message %d: %s %q", i, HeaderSequence, m.Header.Get(HeaderSequence))
		}
		out[i] = n
	}
	return out
}

func span(from, to uint64) []uint64 {
	var out []uint64
	for s := from; s <= to; s++ {
		out = append(out, s)
	}
	return out
}

// TestBatchReaderRead checks that a read returns exactly the requested
// range of a real stream, in order, with its metadata headers; that stored
// messages imitating the end-of-batch statuses are messages; and how the
// end of the stream and a missing stream read.
func TestBatchReaderRead(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.stream(t, "ORDERS")
	const n = 20
	for i := 1; i <= n; i++ {
		m := &nats.Msg{Subject: fmt.Sprintf("orders.%c", 'a'+i%2), Data: fmt.Appendf(nil, "m%d", i)}
		switch i {
		case 7: // imitates "nothing at or after from"
			m.Data, m.Header = nil, nats.Header{"Status": {"404"}, "Description": {"Message Not Found"}}
		case 8: // imitates "end of batch"
			m.Data, m.Header = nil, nats.Header{"Status": {"204"}, "Description": {"EOB"}}
		case 9: // imitates no responders
			m.Data, m.Header = nil, nats.Header{"Status": {"503"}}
		}
		b.publish(t, m)
	}
	r, err := NewBatchReader(b.nc, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	read := func(from uint64, count int) []*nats.Msg {
		t.Helper()
		msgs, err := r.Read(b.ctx, "ORDERS", nil, from, count, 1<<20)
		if err != nil {
			t.Fatalf("Read(%d, %d): %v", from, count, err)
		}
		return msgs
	}
	for _, tc := range []struct {
		from  uint64
		count int
		want  []uint64
	}{
		{1, 1, span(1, 1)},
		{5, 7, span(5, 11)},
		{18, 7, span(18, 20)},
		{20, 1, span(20, 20)},
		{21, 5, nil},
		{1, n, span(1, n)},
	} {
		got := seqs(t, read(tc.from, tc.count))
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Fatalf("Read(%d, %d) = %v, want %v", tc.from, tc.count, got, tc.want)
		}
	}
	msgs := read(1, n)
	for i, m := range msgs {
		if m.Header.Get("Nats-Subject") != fmt.Sprintf("orders.%c", 'a'+(i+1)%2) || m.Header.Get("Nats-Time-Stamp") == "" {
			t.Fatalf("message %d: headers %v", i+1, m.Header)
		}
	}
	if msgs[6].Header.Get("Status") != "404" || msgs[7].Header.Get("Status") != "204" || len(msgs[8].Data) != 0 {
		t.Fatalf("imitations: %v %v %v", msgs[6].Header, msgs[7].Header, msgs[8].Header)
	}
	// dst is appended to.
	dst := read(3, 1)
	dst, err = r.Read(b.ctx, "ORDERS", dst, 12, 2, 1<<20)
	if err != nil || fmt.Sprint(seqs(t, dst)) != "[3 12 13]" {
		t.Fatalf("appending read: %v, %v", seqs(t, dst), err)
	}
	// By subject: every second message.
	onB, err := r.ReadSubject(b.ctx, "ORDERS", "orders.b", nil, 4, 3, 1<<20)
	if err != nil || fmt.Sprint(seqs(t, onB)) != "[5 7 9]" {
		t.Fatalf("ReadSubject: %v, %v", seqs(t, onB), err)
	}
	if _, err := r.Read(b.ctx, "MISSING", nil, 1, 1, 1); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("missing stream: %v, want ErrNoResponders", err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	if _, err := r.Read(ctx, "ORDERS", nil, 1, 1, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("done context: %v, want context.Canceled", err)
	}
	// A late reply to the abandoned read is not taken for the next read's.
	if got := seqs(t, read(15, 1)); fmt.Sprint(got) != "[15]" {
		t.Fatalf("read after an abandoned one: %v", got)
	}
}

// TestEachOnSubject checks that EachOnSubject pages through every message
// on a subject, in order, and nothing else, one direct get per page: for a
// count that is not a multiple of the page size, and one that is.
func TestEachOnSubject(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.stream(t, "IDX")
	var onA, onC []uint64
	for i := range 46 {
		subj := "idx.b"
		switch {
		case i%2 == 0:
			subj = "idx.a"
		case i%3 == 0 && len(onC) < 8:
			subj = "idx.c"
		}
		seq := b.publish(t, &nats.Msg{Subject: subj, Data: []byte(subj)})
		switch subj {
		case "idx.a":
			onA = append(onA, seq)
		case "idx.c":
			onC = append(onC, seq)
		}
	}
	r, err := NewBatchReader(b.nc, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	requests := b.watch(t, "$JS.API.DIRECT.GET.IDX")
	for _, tc := range []struct {
		subject string
		want    []uint64
		pages   int
	}{
		{"idx.a", onA, 6}, // 23 messages: 5 full pages and one of 3
		{"idx.c", onC, 2}, // 8 messages: 2 full pages; the last says none are pending
		{"idx.none", nil, 1},
	} {
		var got []uint64
		err := r.EachOnSubject(b.ctx, "IDX", tc.subject, 4, 10*time.Second, func(m *nats.Msg, seq uint64) {
			if string(m.Data) != tc.subject || m.Header.Get(HeaderSequence) != strconv.FormatUint(seq, 10) {
				t.Fatalf("%s: message %d: %q %v", tc.subject, seq, m.Data, m.Header)
			}
			got = append(got, seq)
		})
		if err != nil || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Fatalf("%s: %v, %v; want %v", tc.subject, got, err, tc.want)
		}
		// Every request was routed to the watcher before the last reply.
		if err := b.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if n := len(requests); n != tc.pages {
			t.Fatalf("%s: %d direct gets, want %d", tc.subject, n, tc.pages)
		}
		for len(requests) > 0 {
			<-requests
		}
	}
	if err := r.EachOnSubject(b.ctx, "MISSING", "x", 4, 10*time.Second, func(*nats.Msg, uint64) {}); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("missing stream: %v", err)
	}
}

// TestEachOnSubjectMaxBytes: pages cut short by a read's 1 MiB (here 30
// messages of 200 KB on one subject, read 16 at a time: about 5 a page) do
// not end the walk; every message is seen once, in order.
func TestEachOnSubjectMaxBytes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.stream(t, "BIG")
	big := make([]byte, 200<<10)
	var want []uint64
	for range 30 {
		want = append(want, b.publish(t, &nats.Msg{Subject: "big.a", Data: big}))
		b.publish(t, &nats.Msg{Subject: "big.other", Data: []byte("x")})
	}
	r, err := NewBatchReader(b.nc, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var got []uint64
	if err := r.EachOnSubject(b.ctx, "BIG", "big.a", 16, 10*time.Second, func(m *nats.Msg, seq uint64) {
		got = append(got, seq)
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("saw %d of %d messages: %v, want %v", len(got), len(want), got, want)
	}
}

// TestEachOnSubjectPaced: pace is called before every read and its done
// func once after it, never two reads inside one pace; a pace error ends
// the walk, returned as is, with no read after it.
func TestEachOnSubjectPaced(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.stream(t, "PACED")
	for i := range 20 {
		b.publish(t, &nats.Msg{Subject: "paced.a", Data: []byte{byte(i)}})
		b.publish(t, &nats.Msg{Subject: "paced.b", Data: []byte{byte(i)}})
	}
	r, err := NewBatchReader(b.nc, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	watched := b.watch(t, "$JS.API.DIRECT.GET.PACED")
	// The copies of the reads arrive on the same connection before their
	// replies, so once a walk returns its reads are in watched.
	requests := func() int { return len(watched) }
	var paced, done, open int
	seen := 0
	pace := func(context.Context) (func(), error) {
		if open != 0 {
			t.Error("a read started before the previous one's done")
		}
		paced++
		open++
		return func() { done++; open-- }, nil
	}
	if err := r.EachOnSubjectPaced(context.Background(), "PACED", "paced.a", 8, 5*time.Second, pace, func(*nats.Msg, uint64) { seen++ }); err != nil {
		t.Fatal(err)
	}
	if seen != 20 || paced != 3 || done != 3 || requests() != 3 {
		t.Errorf("20 messages read 8 at a time: seen %d, paced %d, done %d, reads %d; want 20, 3, 3, 3", seen, paced, done, requests())
	}
	// A pace that refuses the second read.
	stop := errors.New("no more")
	paced, seen = 0, 0
	before := requests()
	err = r.EachOnSubjectPaced(context.Background(), "PACED", "paced.a", 8, 5*time.Second, func(context.Context) (func(), error) {
		if paced++; paced > 1 {
			return nil, stop
		}
		return func() {}, nil
	}, func(*nats.Msg, uint64) { seen++ })
	if err != stop || seen != 8 || requests()-before != 1 {
		t.Errorf("pace refusing the second read: %v, seen %d, reads %d; want %v, 8, 1", err, seen, requests()-before, stop)
	}
}

// TestBatchReaderResendsUnanswered: a read that no server answers within
// hedge.After is sent again, and the try that answers is read. A
// responder on the direct-get subject stands in for a stream's replicas:
// it swallows the first request (a replica that hangs) and answers the
// second with one stored message and the end of the batch, then answers
// the first late: the next read does not take that late answer for its
// own.
func TestBatchReaderResendsUnanswered(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	reqs := make(chan *nats.Msg, 8)
	sub, err := b.nc.ChanSubscribe("$JS.API.DIRECT.GET.HUNG", reqs)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	answer := func(reply, data string) {
		ans := nats.NewMsg(reply)
		ans.Header.Set(HeaderSequence, "7")
		ans.Data = []byte(data)
		_ = b.nc.PublishMsg(ans)
		eob := nats.NewMsg(reply)
		eob.Header.Set("Status", "204")
		_ = b.nc.PublishMsg(eob)
	}
	r, err := NewBatchReader(b.nc, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	read := func() ([]*nats.Msg, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return r.Read(ctx, "HUNG", nil, 1, 4, 1<<20)
	}
	firsts := make(chan *nats.Msg, 1)
	go func() {
		firsts <- <-reqs // the hung replica: no answer yet
		second := <-reqs
		answer(second.Reply, "from the live replica")
	}()
	msgs, err := read()
	if err != nil {
		t.Fatalf("read with its first try unanswered: %v", err)
	}
	if len(msgs) != 1 || string(msgs[0].Data) != "from the live replica" {
		t.Fatalf("read %d messages, want the live replica's one", len(msgs))
	}
	late := <-firsts
	answer(late.Reply, "late, from the hung replica")
	go func() { answer((<-reqs).Reply, "the next read's") }()
	msgs, err = read()
	if err != nil || len(msgs) != 1 || string(msgs[0].Data) != "the next read's" {
		t.Fatalf("next read: %d messages (%v), want its own one", len(msgs), err)
	}
}

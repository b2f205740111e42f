package index

import (
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Group packs the records of consecutive placements into one message per
// slot subject, writes them together, and tells when they are stored.
//
// Two parties use it. Its writer, one goroutine, calls [Group.Add] and then
// [Group.Flush] once. Any goroutine may call [Group.Stored], which first
// waits for Flush. So a goroutine waiting in Stored must never be one the
// writer waits for before it flushes, or the two wait on each other for
// ever. deliver's write pipeline rules that out by its structure: its
// acker fills and flushes each group before it hands it to the confirmer,
// which waits in Stored.
type Group struct {
	slots   map[string][]byte // slot subject -> packed records
	futs    []jetstream.PubAckFuture
	err     error
	flushed chan struct{} // closed once the writes are started
	wait    sync.Once
}

// NewGroup returns an empty, open group.
func NewGroup() *Group {
	return &Group{slots: make(map[string][]byte), flushed: make(chan struct{})}
}

// Add packs rec into the message of its key's slot. Writer only, before
// Flush.
func (g *Group) Add(rec Record) {
	subj := Subject(rec.Key)
	g.slots[subj] = rec.AppendTo(g.slots[subj])
}

// Flush starts the group's writes, one asynchronous publish per slot
// subject that has records, and releases [Group.Stored]. Writer only,
// once. A publish that cannot be started is remembered as the group's
// failure.
func (g *Group) Flush(js jetstream.JetStream) {
	for subj, data := range g.slots {
		fut, err := js.PublishMsgAsync(&nats.Msg{Subject: subj, Data: data})
		if err != nil {
			g.err = err
			continue
		}
		g.futs = append(g.futs, fut)
	}
	g.slots = nil
	close(g.flushed)
}

// Stored waits until [Group.Flush] has been called and every write it
// started has its PubAck or its error; it returns the first failure, nil
// if every record is stored. It waits for ever on a group never flushed.
// Safe to call from several goroutines and more than once: later calls
// return the same result.
func (g *Group) Stored() error {
	<-g.flushed
	g.wait.Do(func() {
		for _, fut := range g.futs {
			select {
			case <-fut.Ok():
			case err := <-fut.Err():
				if g.err == nil {
					g.err = err
				}
			}
		}
		g.futs = nil
	})
	return g.err
}

package deliver

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

// TestListReplySize: a list reply's JSON, its next cursor included, is at
// most the connection's max payload less 4 KiB (docs/guide.md "Pending
// messages"), even when the cursor is large: here ids of 3000 bytes (the
// cursor holds the last item's) and a max payload of 16 KiB, so that a
// page cut by size leaves less room than the cursor takes. Every page is
// answered, and the pages list each message once.
func TestListReplySize(t *testing.T) {
	t.Parallel()
	const maxPayload = 16 << 10
	opts := natstest.Options(t.TempDir())
	opts.MaxPayload = maxPayload
	srv := natstest.Start(t, opts)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	b := &ownerBundle{t: t, srv: srv, nc: nc, js: js}
	b.targetStream()
	b.startConfig("A", Config{Levels: levels.MustParse(listLevels), LeaseTTL: ownerTTL})
	const n = 8
	for i := range n {
		id := fmt.Sprintf("big-%d-%s", i, strings.Repeat("x", 3000))
		b.publishTo("tgt.big", "payload", nats.Header{contract.HeaderLevel: {"2"}, contract.HeaderNatsMsgID: {id}})
	}
	seen := map[string]bool{}
	var cursor string
	for pages := 0; ; pages++ {
		if pages > n {
			t.Fatalf("more than %d pages", n)
		}
		data, _ := json.Marshal(contract.PendingRequest{Cursor: cursor})
		m, err := nc.Request(contract.PendingSubjectFor("tgt.big"), data, 30*time.Second)
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		if len(m.Data) > maxPayload-4<<10 {
			t.Fatalf("page %d: reply of %d bytes, over the max payload %d less 4 KiB", pages, len(m.Data), maxPayload)
		}
		var r contract.PendingReply
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Fatalf("page %d: %v: %.200s", pages, err, m.Data)
		}
		for _, it := range r.Items {
			if seen[it.ID] {
				t.Fatalf("page %d: %.10s… listed twice", pages, it.ID)
			}
			seen[it.ID] = true
		}
		if r.Next == "" {
			break
		}
		cursor = r.Next
	}
	if len(seen) != n {
		t.Fatalf("listed %d messages, want %d", len(seen), n)
	}
}

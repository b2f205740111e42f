package level

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/offsets"
)

// TestCorrection: one row per case of the offset a load starts from
// (correction), each with the offset, the reason and whether it is
// written, and rows where the stored offset stands. The errors are wrapped
// as offsets.Store.Load wraps them.
func TestCorrection(t *testing.T) {
	t.Parallel()
	deleted := fmt.Errorf("%w for DELAYD_5S: %w (key DELAYD_5S at revision 3, purge)", offsets.ErrNotFound, offsets.ErrDeleted)
	notFound := fmt.Errorf("%w for DELAYD_5S", offsets.ErrNotFound)
	corrupt := fmt.Errorf("%w: DELAYD_5S = %q", offsets.ErrCorrupt, "x")
	purged := jetstream.StreamState{FirstSeq: 5, LastSeq: 9, Msgs: 5} // sequences up to 4 purged
	const again = "delivering from sequence 5: messages 5..9 that were delivered already are delivered again"
	for _, tt := range []struct {
		name     string
		found    offsetState
		st       jetstream.StreamState
		replaced bool
		off      uint64
		reason   string
		write    bool
	}{
		{name: "replaced", found: offsetState{off: 7}, st: purged, replaced: true,
			off: 4, reason: "offset 7 belongs to a level stream deleted while delayd ran; " + again, write: true},
		{name: "deleted", found: offsetState{err: deleted}, st: purged,
			off: 4, reason: deleted.Error() + "; " + again, write: true},
		{name: "not found, purged", found: offsetState{err: notFound}, st: purged,
			off: 4, reason: "no offset stored, but the stream was purged up to sequence 4, so it was delivered from before; " + again, write: true},
		{name: "not found, new stream", found: offsetState{err: notFound}, st: jetstream.StreamState{FirstSeq: 1, LastSeq: 3, Msgs: 3},
			off: 0, reason: "new level stream: no offset yet", write: false},
		{name: "corrupt", found: offsetState{err: corrupt}, st: purged,
			off: 4, reason: corrupt.Error() + "; " + again, write: true},
		{name: "beyond the last sequence", found: offsetState{off: 12}, st: purged,
			off: 4, reason: "offset 12 beyond the stream's last sequence 9; " + again, write: true},
		{name: "below the first sequence", found: offsetState{off: 2}, st: purged,
			off: 4, reason: "offset 2 below the stream's first sequence 5: sequences up to 4 were purged, so delivered; " + again, write: true},

		// No correction: the stored offset stands.
		{name: "stands", found: offsetState{off: 7}, st: purged, off: 7},
		{name: "stands at first-1", found: offsetState{off: 4}, st: purged, off: 4},
		{name: "stands at the last sequence", found: offsetState{off: 9}, st: purged, off: 9},
		{name: "new stream never written", found: offsetState{err: notFound}, st: jetstream.StreamState{},
			off: 0, reason: "new level stream: no offset yet"},
		{name: "replaced, no offset stored: as not replaced", found: offsetState{err: notFound}, st: purged, replaced: true,
			off: 4, reason: "no offset stored, but the stream was purged up to sequence 4, so it was delivered from before; " + again, write: true},
		{name: "empty stream after a purge", found: offsetState{off: 12}, st: jetstream.StreamState{FirstSeq: 10, LastSeq: 9},
			off: 9, reason: "offset 12 beyond the stream's last sequence 9; the stream holds no messages: nothing is delivered again", write: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			off, reason, write := correction(tt.found, tt.st, tt.replaced)
			if off != tt.off || reason != tt.reason || write != tt.write {
				t.Errorf("correction = (%d, %q, %v); want (%d, %q, %v)", off, reason, write, tt.off, tt.reason, tt.write)
			}
		})
	}
}

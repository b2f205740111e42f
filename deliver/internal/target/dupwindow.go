package target

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// shortDuplicateWindow is the duplicate window under which a stream target
// gets a warning: JetStream's default, 2 minutes. A delivery that reaches
// the stream again after its window (a publish a hung NATS node held in its
// sockets and stored when it resumed, after another owner delivered it
// again) is stored twice, and delayd cannot fence a user's stream beyond
// it (docs/guarantees.md#stream-targets-and-their-duplicate-window).
const shortDuplicateWindow = 2 * time.Minute

// streamWindow is a stream target whose duplicate window is short.
type streamWindow struct {
	stream string
	window time.Duration
}

// dupWindows finds the stream targets whose duplicate window is under
// shortDuplicateWindow, from the stream configs Refresh lists anyway (no
// read of its own), and warns once per such stream per process, the first
// time Bound finds a target subject it captures. Guarded by Bindings.mu.
type dupWindows struct {
	short  map[string]streamWindow  // subject filter -> its stream, if that stream's window is short
	warned map[string]time.Duration // stream -> the window it was warned about
}

// noteWindow adds cfg's subject filters to short if its window is short.
func noteWindow(short map[string]streamWindow, cfg jetstream.StreamConfig) {
	if cfg.Duplicates >= shortDuplicateWindow {
		return
	}
	for _, s := range cfg.Subjects {
		short[s] = streamWindow{stream: cfg.Name, window: cfg.Duplicates}
	}
}

// matched warns, once per stream and window, if the stream capturing
// pattern has a short duplicate window; subject is the target.
func (d *dupWindows) matched(pattern, subject string, logger *slog.Logger) {
	w, ok := d.short[pattern]
	if !ok {
		return
	}
	if was, ok := d.warned[w.stream]; ok && was == w.window {
		return
	}
	if d.warned == nil {
		d.warned = map[string]time.Duration{}
	}
	d.warned[w.stream] = w.window
	logger.Warn("stream target's duplicate window is under 2 minutes: a delivery a NATS node holds longer (a hung node) may be stored twice",
		slog.String("stream", w.stream), slog.Duration("duplicate_window", w.window), slog.String("subject", subject))
}

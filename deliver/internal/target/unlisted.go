package target

import (
	"context"
	"fmt"
	"strings"
)

// keepUnlisted returns the subject filters, as of the last refresh, of the
// streams the account has but the stream list left out, and adds them to
// listed (stream -> its filters). A stream list leaves out a stream whose
// leader did not answer the meta leader within 4 s (its node killed or
// hung, its election under way: nats-server puts it in the answer's
// "missing", which nats.go does not return). Dropping its filters would
// take its subjects for core ones until the next refresh: a delivery there
// answered "no responders" while it elects would count as delivered to no
// one, and a core publish confirmed by a flush would be stored by no
// leader. The stream names come from STREAM.NAMES, which the meta leader
// answers from its assignments, whatever a stream's leader does. A stream
// this process has never seen listed (it started during the election)
// stays unknown until a refresh lists it.
func (t *Bindings) keepUnlisted(ctx context.Context, listed map[string][]string) ([]string, error) {
	prev := t.answers.streams()
	var kept []string
	names := t.js.StreamNames(ctx)
	for name := range names.Name() {
		if _, ok := listed[name]; ok || strings.HasPrefix(name, "DELAYD_") {
			continue
		}
		if subjects, ok := prev[name]; ok {
			listed[name] = subjects
			kept = append(kept, subjects...)
		}
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("list stream names: %w", err)
	}
	return kept, nil
}

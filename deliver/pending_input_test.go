package deliver

import (
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/levels"
)

// TestListBadInput: a list request the API cannot answer as sent is
// refused with code 400 and a reason naming the fault: an unknown option
// (a misspelt "limit" is not ignored), a target under the ingress prefix
// (no message can have it: a publish there is ingress), a wildcard
// target (no message has one).
func TestListBadInput(t *testing.T) {
	t.Parallel()
	b := setupOwners(t)
	b.targetStream()
	b.startConfig("A", Config{Levels: levels.MustParse(listLevels), LeaseTTL: ownerTTL})
	for _, c := range []struct {
		subject, payload, reason string
	}{
		{contract.PendingSubjectFor("tgt.x"), `{"limt":5}`, `unknown field "limt"`},
		{contract.PendingSubjectFor("tgt.x"), `{"limit":5} {}`, "data after"},
		{contract.PendingSubjectFor(contract.PrefixDefault + ".x"), ``, "ingress prefix"},
		{contract.PendingSubjectFor("tgt.*"), ``, "wildcard"},
		// In delayd's words, not encoding/json's.
		{contract.PendingSubjectFor("tgt.x"), `{"limit":"10"}`, "error: bad request: limit must be a number"},
		{contract.PendingSubjectFor("tgt.x"), `{"limit":2.5}`, "error: bad request: limit must be a whole number in 1..1000"},
		{contract.PendingSubjectFor("tgt.x"), `{"due_before":"tomorrow"}`, "error: bad request: due_before must be RFC 3339, e.g. 2026-12-03T09:00:00Z"},
		{contract.PendingSubjectFor("tgt.x"), `{"due_after":5}`, "error: bad request: due_after must be RFC 3339, e.g. 2026-12-03T09:00:00Z"},
		{contract.PendingSubjectFor("tgt.x"), `{"payload":"yes"}`, "error: bad request: payload must be true or false"},
		{contract.PendingSubjectFor("tgt.x"), `{"cursor":5}`, "error: bad request: cursor must be a string"},
	} {
		m, err := b.nc.Request(c.subject, []byte(c.payload), 30*time.Second)
		if err != nil {
			t.Fatalf("%s %s: %v", c.subject, c.payload, err)
		}
		body := string(m.Data)
		if code := m.Header.Get(contract.HeaderStatus); code != "400" || !strings.HasPrefix(body, contract.CancelReplyErrorPrefix) || !strings.Contains(body, c.reason) || strings.Contains(body, "json:") || strings.Contains(body, "parsing time") {
			t.Errorf("%s %s: code %s, %q; want 400 and an error naming %q", c.subject, c.payload, code, body, c.reason)
		}
	}
}

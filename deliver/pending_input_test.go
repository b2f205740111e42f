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
	} {
		m, err := b.nc.Request(c.subject, []byte(c.payload), 30*time.Second)
		if err != nil {
			t.Fatalf("%s %s: %v", c.subject, c.payload, err)
		}
		body := string(m.Data)
		if code := m.Header.Get(contract.HeaderStatus); code != "400" || !strings.HasPrefix(body, contract.CancelReplyErrorPrefix) || !strings.Contains(body, c.reason) {
			t.Errorf("%s %s: code %s, %q; want 400 and an error naming %q", c.subject, c.payload, code, body, c.reason)
		}
	}
}

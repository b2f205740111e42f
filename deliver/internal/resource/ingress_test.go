package resource

import (
	"strconv"
	"strings"
	"testing"
)

// TestOldIngressSubject: the subject a message stored under another
// ingress partition count was published to.
func TestOldIngressSubject(t *testing.T) {
	t.Parallel()
	type oldCase struct {
		n            int
		stored, want string
		old          bool
	}
	cases := []oldCase{
		{1, "delay.orders.close", "delay.orders.close", false},
		{1, "delayd.in.2.orders.close", "delay.orders.close", true},
		{4, "delay.orders.close", "delay.orders.close", true},
		{4, "delayd.in.1.orders.close", "delay.orders.close", false},
		{4, "delayd.in.3.orders.close", "delay.orders.close", true}, // partition 1 under 4
		{2, "delayd.in.1.orders.close", "delay.orders.close", IngressPartitionOf("delay.orders.close", 2) != 1},
	}
	// Subjects of every partition under 4: stored under their own
	// partition they are not old, under the next one they are.
	for i := range 16 {
		published := "delay.t" + strconv.Itoa(i)
		p := IngressPartitionOf(published, 4)
		cases = append(cases,
			oldCase{4, IngressPartitionSubject(p) + strings.TrimPrefix(published, "delay."), published, false},
			oldCase{4, IngressPartitionSubject((p+1)%4) + strings.TrimPrefix(published, "delay."), published, true})
	}
	for _, tc := range cases {
		got, old := oldIngressSubject("delay", tc.n, tc.stored)
		if got != tc.want || old != tc.old {
			t.Errorf("N=%d, stored %q: %q %v; want %q %v", tc.n, tc.stored, got, old, tc.want, tc.old)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestPendingLsUsage: ls refuses a target under the ingress prefix (the
// default's, or --prefix's) as a usage error before any connection is
// tried, as delayd would refuse it: no message can have it.
func TestPendingLsUsage(t *testing.T) {
	t.Setenv("DELAYD_NATS_URL", "nats://127.0.0.1:1") // never dialled
	for _, args := range [][]string{{"ls", "delay.x"}, {"--prefix", "sched", "ls", "sched.x"}, {"ls", "a.*"}} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, strings.NewReader(""), &out, &errOut); code != exitUsage {
			t.Errorf("run(%q) = %d, want %d; stderr %q", args, code, exitUsage, errOut.String())
		}
	}
}

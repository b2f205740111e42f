package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestShutdownWithinStopBudget: delayd's own shutdown bound, shutdownTimeout, ends before the stop budget of the
// deploy files (the systemd unit's TimeoutStopSec, the Deployment's terminationGracePeriodSeconds), so that past its
// bound delayd logs the step under way and exits by itself, before systemd or the kubelet sends SIGKILL
// (docs/operations.md#deployment-systemd, docs/operations.md#deployment-kubernetes).
func TestShutdownWithinStopBudget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ file, key, sep string }{
		{"../../deploy/systemd/delayd.service", "TimeoutStopSec", "="},
		{"../../deploy/k8s/deployment.yaml", "terminationGracePeriodSeconds", ":"},
	} {
		data, err := os.ReadFile(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		var values []string
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if strings.HasPrefix(line, "#") {
				continue
			}
			if k, v, ok := strings.Cut(line, tc.sep); ok && strings.TrimSpace(k) == tc.key {
				values = append(values, strings.TrimSpace(v))
			}
		}
		if len(values) != 1 {
			t.Errorf("%s: %d values of %s (%q), want one", tc.file, len(values), tc.key, values)
			continue
		}
		secs, err := strconv.Atoi(values[0])
		if err != nil {
			t.Errorf("%s: %s=%q: want whole seconds", tc.file, tc.key, values[0])
			continue
		}
		if budget := time.Duration(secs) * time.Second; shutdownTimeout >= budget {
			t.Errorf("%s: %s %s is not more than delayd's shutdownTimeout %s: the stop would be killed before delayd's own bound",
				tc.file, tc.key, budget, shutdownTimeout)
		} else {
			t.Logf("%s: %s %s > shutdownTimeout %s", tc.file, tc.key, budget, shutdownTimeout)
		}
	}
}

package itest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// CtlResult is one delayctl run.
type CtlResult struct {
	Stdout, Stderr string
	Code           int
}

// Delayctl runs the delayctl binary against url (none if ""), with no other DELAYD_* variable set.
func Delayctl(t *testing.T, url string, args ...string) CtlResult {
	t.Helper()
	env := map[string]string{}
	if url != "" {
		env["DELAYD_NATS_URL"] = url
	}
	return DelayctlEnv(t, env, args...)
}

// DelayctlEnv runs the delayctl binary with exactly the DELAYD_* variables of env set.
func DelayctlEnv(t *testing.T, env map[string]string, args ...string) CtlResult {
	t.Helper()
	bin, err := delayctlBinary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DELAYD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	r := CtlResult{Stdout: stdout.String(), Stderr: stderr.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.Code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("delayctl %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// Want fails the test unless the run exited with code and its output contains every text.
func (r CtlResult) Want(t *testing.T, code int, texts ...string) {
	t.Helper()
	if r.Code != code {
		t.Fatalf("exit code %d, want %d\nstdout: %s\nstderr: %s", r.Code, code, r.Stdout, r.Stderr)
	}
	for _, s := range texts {
		if !strings.Contains(r.Stdout+r.Stderr, s) {
			t.Errorf("output lacks %q\nstdout: %s\nstderr: %s", s, r.Stdout, r.Stderr)
		}
	}
}

package integration

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/integration/internal/itest"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

// TestPermissionDeniedTarget runs delayd as a NATS user that may not publish
// to forbidden.>: a delivery there is not counted as delivered (the server
// drops a refused core publish silently, apart from an async -ERR) but
// retried and then dead-lettered, and other targets keep flowing.
func TestPermissionDeniedTarget(t *testing.T) {
	t.Parallel()
	all := &server.SubjectPermission{Allow: []string{">"}}
	opts := natstest.Options(t.TempDir())
	opts.Users = []*server.User{
		{Username: "delayd", Password: "d", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"forbidden.>"}},
			Subscribe: all,
		}},
		{Username: "client", Password: "c", Permissions: &server.Permissions{Publish: all, Subscribe: all}},
	}
	srv := natstest.Start(t, opts)

	var svcRef atomic.Pointer[deliver.Service]
	dnc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("delayd", "d"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if svc := svcRef.Load(); svc != nil {
			svc.HandleAsyncError(err)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dnc.Close)
	svc, err := deliver.New(dnc, deliver.Config{Prefix: "delay", Levels: levels.MustParse("100ms"), Logger: itest.Logger(t), LeaseTTL: itest.LeaseTTL})
	if err != nil {
		t.Fatal(err)
	}
	svcRef.Store(svc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	itest.WaitFor(t, 20*time.Second, "delayd ready", svc.Ready)

	cnc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("client", "c"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cnc.Close)
	js, _ := jetstream.New(cnc)
	var allowed atomic.Int64
	if _, err := cnc.Subscribe("allowed.x", func(*nats.Msg) { allowed.Add(1) }); err != nil {
		t.Fatal(err)
	}
	_ = cnc.Flush()
	for _, subj := range []string{"delay.forbidden.x", "delay.allowed.x", "delay.allowed.x"} {
		hdr := itest.Level(1)
		hdr.Set("Nats-Msg-Id", "pd-"+subj+"-"+time.Now().Format(time.RFC3339Nano))
		if _, err := js.PublishMsg(context.Background(), &nats.Msg{Subject: subj, Data: []byte("x"), Header: hdr}); err != nil {
			t.Fatal(err)
		}
	}
	itest.WaitFor(t, 30*time.Second, "the refused delivery dead-lettered", func() bool {
		s, err := js.Stream(context.Background(), deliver.DLQStream)
		if err != nil {
			return false
		}
		m, err := s.GetLastMsgForSubject(context.Background(), "delayd.dlq.undeliverable")
		if err != nil {
			return false
		}
		if got := m.Header.Get(contract.HeaderSubject); got != "forbidden.x" {
			t.Fatalf("dead letter for %q, want forbidden.x", got)
		}
		if e := m.Header.Get(contract.HeaderError); !strings.Contains(e, "permission denied") {
			t.Fatalf("Delay-Error %q does not say permission denied", e)
		}
		return true
	})
	itest.WaitFor(t, 10*time.Second, "allowed deliveries", func() bool { return allowed.Load() == 2 })
	// The counters move when the scanner confirms its window, which may
	// trail the subscriber's callbacks.
	itest.WaitFor(t, 10*time.Second, "the counters", func() bool {
		_, ss := svc.Stats()
		for _, s := range ss {
			if s.Stream == "DELAYD_100MS" {
				return s.Delivered >= 2 && s.DeadLettered >= 1
			}
		}
		return false
	})
	_, ss := svc.Stats()
	for _, s := range ss {
		if s.Stream == "DELAYD_100MS" && (s.Delivered != 2 || s.DeadLettered != 1) {
			t.Errorf("DELAYD_100MS: delivered=%d dead-lettered=%d, want 2 and 1", s.Delivered, s.DeadLettered)
		}
	}
}

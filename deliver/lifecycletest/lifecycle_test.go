// Package lifecycletest checks that nothing a [deliver.Service] starts
// outlives its Run (docs/reshape.md#33-goleak-and-the-test-that-nothing-outlives-stop):
// no subscription left on its connection, no goroutine left in the
// process. goleak sees the whole process, so these tests have a package
// of their own, with no parallel tests beside them, and the nats-server
// runs in a child process: a server in this process starts goroutines of
// its own for every stream and consumer the Service creates, and they
// outlive the Service by design.
package lifecycletest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/contract"
	"github.com/delayd/delayd/deliver"
	"github.com/delayd/delayd/internal/natstest"
	"github.com/delayd/delayd/levels"
)

// serverEnv names the store directory of the nats-server this test binary
// runs instead of its tests when it is the child process ([startServer]).
const serverEnv = "DELAYD_LIFECYCLETEST_SERVER"

func TestMain(m *testing.M) {
	if dir := os.Getenv(serverEnv); dir != "" {
		os.Exit(serve(dir))
	}
	os.Exit(m.Run())
}

// serve runs the child's nats-server ([natstest.Options] in dir), prints
// its client URL and shuts it down once stdin is closed.
func serve(dir string) int {
	srv, err := server.NewServer(natstest.Options(dir))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go srv.Start()
	if !srv.ReadyForConnections(time.Minute) {
		fmt.Fprintln(os.Stderr, "nats-server not ready for connections within a minute")
		return 1
	}
	fmt.Println(srv.ClientURL())
	_, _ = io.Copy(io.Discard, os.Stdin)
	srv.Shutdown()
	srv.WaitForShutdown()
	return 0
}

// startServer starts a nats-server in a child process (this test binary,
// [serve]) and returns its client URL; the server stops when the test
// ends.
func startServer(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serverEnv+"="+t.TempDir())
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	url, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("child nats-server: %v", err)
	}
	return strings.TrimSpace(url)
}

// connect returns a connection to url, warmed up: its request mux (a
// subscription and a goroutine that live as long as the connection) is
// made now, before the test takes its baselines. It is closed when the
// test ends.
func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if _, err := nc.Request("lifecycletest.warmup", nil, time.Minute); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("warm-up request: %v, want no responders", err)
	}
	return nc
}

// running is a Service run by a test, with its stats API.
type running struct {
	svc       *deliver.Service
	stop      context.CancelFunc
	done      chan error
	stopStats func() error
}

// start runs a Service on nc, with every kind of part: two levels, a
// partitioned one, two ingress partitions, and the stats API; it waits
// until the Service is ready. Its id index keeps records for 400ms only,
// so that the janitor's trim passes keep answers within the test.
func start(t *testing.T, nc *nats.Conn) *running {
	t.Helper()
	parts, err := levels.ParsePartitions("1s=2")
	if err != nil {
		t.Fatal(err)
	}
	svc, err := deliver.New(nc, deliver.Config{Levels: levels.MustParse("200ms 1s"), Partitions: parts, IngressPartitions: 2, IndexKeep: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stopStats, err := svc.StartStatsAPI()
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	r := &running{svc: svc, stop: stop, done: make(chan error, 1), stopStats: stopStats}
	go func() { r.done <- svc.Run(ctx) }()
	waitFor(t, "the Service ready", svc.Ready)
	return r
}

// shutdown stops the Service, waits for Run, then stops the stats API.
func (r *running) shutdown(t *testing.T) {
	t.Helper()
	r.stop()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of its context's end")
	}
	if err := r.stopStats(); err != nil {
		t.Errorf("stop the stats API: %v", err)
	}
}

// exercise works every API of the Services on the server cl is connected
// to: info, stats, a cancel, a status, a delivery and a merge.
func exercise(t *testing.T, cl *nats.Conn, target *nats.Subscription, round string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(cl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := delayd.FetchInfo(ctx, cl); err != nil {
		t.Fatalf("info: %v", err)
	}
	if _, err := cl.RequestWithContext(ctx, contract.StatsSubject, nil); err != nil {
		t.Fatalf("stats: %v", err)
	}
	subject := target.Subject
	id, err := delayd.Publish(ctx, js, subject, []byte("cancel "+round), delayd.WithDuration(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := delayd.Cancel(ctx, cl, subject, id); err != nil || res != delayd.Cancelled {
		t.Fatalf("cancel: %v %v, want cancelled", res, err)
	}
	if _, err := delayd.Status(ctx, cl, subject, id); err != nil {
		t.Fatalf("status: %v", err)
	}
	for i := range 2 { // the second merges into the first
		if _, err := delayd.Publish(ctx, js, subject, []byte(fmt.Sprint("merge ", round, i)), delayd.WithDuration(time.Second), delayd.WithMergeKey("k-"+round)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := delayd.Publish(ctx, js, subject, []byte("deliver "+round), delayd.WithDuration(200*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := target.NextMsg(time.Minute)
		if err != nil {
			t.Fatalf("waiting for %q: %v", "deliver "+round, err)
		}
		if string(m.Data) == "deliver "+round {
			return
		}
	}
}

// noLeftovers checks, with the connections still open, that no
// connection of ncs holds more subscriptions than its base, and that no
// goroutine is left but those opts ignores.
func noLeftovers(t *testing.T, ncs []*nats.Conn, base []int, opts goleak.Option) {
	t.Helper()
	for i, nc := range ncs {
		if n := nc.NumSubscriptions(); n != base[i] {
			t.Errorf("connection %d holds %d subscriptions after Run returned, %d before the Service", i, n, base[i])
		}
	}
	goleak.VerifyNone(t, opts)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
	}
}

// TestNothingOutlivesStop: once a Service's Run has returned and its stats
// API is stopped, its connection holds no subscription it did not hold
// before, and no goroutine is left: not the electors, levels, retirers,
// decide workers, routers' ackers, committers, lease renewals, membership,
// the cancel API's workers, nor a JetStream publisher's reply
// subscription (the routers' level writes, the janitor's kept answers:
// the test waits until the janitor kept some).
func TestNothingOutlivesStop(t *testing.T) {
	url := startServer(t)
	nc := connect(t, url) // the Service's
	cl := connect(t, url) // the publisher's and the target's
	target, err := cl.SubscribeSync("lifecycle.target")
	if err != nil {
		t.Fatal(err)
	}
	opts, base := goleak.IgnoreCurrent(), nc.NumSubscriptions()

	r := start(t, nc)
	exercise(t, cl, target, "one")
	waitFor(t, "the janitor keeping answers", func() bool { return r.svc.AnswerStats().Kept > 0 })
	r.shutdown(t)
	noLeftovers(t, []*nats.Conn{nc}, []int{base}, opts)
}

// TestNothingOutlivesStopTwo: the same with two Services on one server,
// the first stopped while it owns leases, so the second takes them over
// in the middle of its run.
func TestNothingOutlivesStopTwo(t *testing.T) {
	url := startServer(t)
	ncA, ncB := connect(t, url), connect(t, url)
	cl := connect(t, url)
	target, err := cl.SubscribeSync("lifecycle.target")
	if err != nil {
		t.Fatal(err)
	}
	opts, base := goleak.IgnoreCurrent(), []int{ncA.NumSubscriptions(), ncB.NumSubscriptions()}

	a := start(t, ncA)
	b := start(t, ncB)
	waitFor(t, "both Services live and holding their share", func() bool {
		la, _, ha := a.svc.Balance()
		lb, _, hb := b.svc.Balance()
		return la == 2 && lb == 2 && ha > 0 && hb > 0
	})
	exercise(t, cl, target, "one")
	a.shutdown(t)
	waitFor(t, "the second Service holding every lease", func() bool {
		for _, l := range b.svc.Leases() {
			if !l.Held {
				return false
			}
		}
		return true
	})
	exercise(t, cl, target, "two")
	b.shutdown(t)
	noLeftovers(t, []*nats.Conn{ncA, ncB}, base, opts)
}

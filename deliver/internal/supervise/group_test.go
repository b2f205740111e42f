package supervise

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// blockUntilDone is a component that returns nil once its context ends,
// and closes started when it runs.
func blockUntilDone(started chan<- struct{}) Func {
	return func(ctx context.Context) error {
		if started != nil {
			close(started)
		}
		<-ctx.Done()
		return nil
	}
}

// waitWithin returns g.Wait(), failing the test if it has not returned
// within a minute (a liveness bound: a component its context's end did
// not reach never returns, and the test would hang until go test's
// timeout).
func waitWithin(t *testing.T, g *Group) error {
	t.Helper()
	ch := make(chan error, 1)
	go func() { ch <- g.Wait() }()
	select {
	case err := <-ch:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("Wait did not return within a minute; running %v", g.Running())
		return nil
	}
}

// TestGroupCleanStop: components that return nil at their context's end
// all return once the parent context ends, Wait returns nil, and no
// goroutine is left.
func TestGroupCleanStop(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithCancel(context.Background())
	g := New(ctx, nil)
	a, b := make(chan struct{}), make(chan struct{})
	g.Go("a", blockUntilDone(a))
	g.Go("b", blockUntilDone(b))
	<-a
	<-b
	if got := g.Running(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("running %v, want [a b]", got)
	}
	cancel()
	if err := waitWithin(t, g); err != nil {
		t.Fatalf("Wait: %v, want nil", err)
	}
	if got := g.Running(); len(got) != 0 {
		t.Fatalf("running after Wait: %v", got)
	}
}

// TestGroupFirstErrorCancels: the first error cancels the others, and
// Wait returns it (not a later one) once every component has returned.
func TestGroupFirstErrorCancels(t *testing.T) {
	defer goleak.VerifyNone(t)
	errFirst, errLater := errors.New("first"), errors.New("later")
	g := New(context.Background(), nil)
	started := make(chan struct{})
	returned := make(chan struct{})
	g.Go("waiter", Func(func(ctx context.Context) error {
		close(started)
		<-ctx.Done()
		close(returned)
		return errLater
	}))
	<-started
	g.Go("failer", Func(func(context.Context) error { return errFirst }))
	if err := waitWithin(t, g); !errors.Is(err, errFirst) {
		t.Fatalf("Wait: %v, want %v", err, errFirst)
	}
	select {
	case <-returned:
	default:
		t.Fatal("Wait returned before every component did")
	}
}

// TestGroupNestedFailsParent: a Group made in a component of another
// fails the parent at its first error at once, not when its own Wait
// returns: the parent's other components stop while the nested Group's
// still run.
func TestGroupNestedFailsParent(t *testing.T) {
	defer goleak.VerifyNone(t)
	errInner := errors.New("inner")
	outer := New(context.Background(), nil)
	sibling := make(chan struct{}) // closed when the outer sibling saw its context end
	release := make(chan struct{}) // lets the nested slow component return
	outer.Go("sibling", Func(func(ctx context.Context) error {
		<-ctx.Done()
		close(sibling)
		return nil
	}))
	outer.Go("nested", Func(func(ctx context.Context) error {
		inner := New(ctx, nil)
		inner.Go("slow", Func(func(ctx context.Context) error {
			<-ctx.Done()
			<-release
			return nil
		}))
		inner.Go("failer", Func(func(context.Context) error { return errInner }))
		return inner.Wait()
	}))
	select {
	case <-sibling:
	case <-time.After(time.Minute):
		t.Fatal("the outer sibling was not stopped by the nested Group's error within a minute")
	}
	close(release)
	if err := outer.Wait(); !errors.Is(err, errInner) {
		t.Fatalf("Wait: %v, want %v", err, errInner)
	}
}

// TestGroupWaitWithoutComponents: Wait on an empty Group returns nil at once.
func TestGroupWaitWithoutComponents(t *testing.T) {
	defer goleak.VerifyNone(t)
	if err := New(context.Background(), nil).Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
}

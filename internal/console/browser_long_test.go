//go:build long

package console_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/delayd/delayd"
	"github.com/delayd/delayd/internal/console"
)

// screenshotDir is where TestBrowser writes its screenshots: $DELAYD_SCREENSHOTS, else internal/console/screenshots
// (git ignores it). README and docs/development.md name it.
func screenshotDir(t *testing.T) string {
	dir := os.Getenv("DELAYD_SCREENSHOTS")
	if dir == "" {
		dir = "screenshots"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// browser starts a headless Chromium (the Debian package chromium, which .ci/run installs) and returns its tab's
// context; the test is skipped when none is installed.
func browser(t *testing.T) context.Context {
	t.Helper()
	var path string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		if os.Getenv("DELAYD_BROWSER_REQUIRED") != "" {
			t.Fatal("no chromium on PATH, and DELAYD_BROWSER_REQUIRED is set (.ci/run sets it after installing chromium)")
		}
		t.Skip("no chromium on PATH: apt-get install chromium (.ci/run does, and there this test fails instead)")
	}
	parent, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.WindowSize(1280, 900))
	alloc, cancelAlloc := chromedp.NewExecAllocator(parent, opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(cancelTab)
	return ctx
}

// TestBrowser drives the console in headless Chromium against a real delayd and nats-server: the overview, a
// target, a message with a hostile id, header and payload (shown as text: no <img> element appears, no dialog
// opens), a cancel refused without the token, a login, a cancel that acts (the status API says cancelled) and a
// reschedule whose answer is shown as delayd gave it. Screenshots of each page go to screenshotDir.
func TestBrowser(t *testing.T) {
	const token = "0123456789abcdef-console"
	ctx := browser(t)
	b := setup(t, console.Config{Token: token})
	id := "id-" + hostile
	b.publish(t, id)
	b.publish(t, "m2")
	dir := screenshotDir(t)

	var dialogs atomic.Int32
	if err := chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1)
		}
	}); err != nil {
		t.Fatal(err)
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	text := func() string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	images := func(where string) {
		t.Helper()
		if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.images.length`)); err != nil || n != 0 {
			t.Errorf("%s: %d <img> elements (%v): a published value became markup", where, n, err)
		}
	}
	click := func(sel string) int64 {
		t.Helper()
		resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("click %s: %v", sel, err)
		}
		return resp.Status
	}

	if err := chromedp.Do(ctx, chromedp.Navigate(b.srv.URL+"/console/")); err != nil {
		t.Fatal(err)
	}
	if s := text(); !strings.Contains(s, "DELAYD_1H") || !strings.Contains(s, "Dead letters") {
		t.Errorf("overview:\n%s", s)
	}
	shot("overview")

	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(`header input[name=subject]`), target)); err != nil {
		t.Fatal(err)
	}
	if code := click(`header form[action="/console/target"] button`); code != 200 {
		t.Fatalf("target page: %d", code)
	}
	if s := text(); !strings.Contains(s, id) || !strings.Contains(s, "Pending by due time") {
		t.Errorf("target page: want the id as text and the histogram:\n%s", s)
	}
	images("target page")
	shot("target")

	if code := click(`table a`); code != 200 { // the first by due: the hostile id's
		t.Fatalf("message page: %d", code)
	}
	if code := click(`a[href*="payload=1"]`); code != 200 {
		t.Fatalf("message page with payload: %d", code)
	}
	if s := text(); !strings.Contains(s, "X-Note\t"+hostile) || !strings.Contains(s, "payload "+hostile) {
		t.Errorf("message page: want the header and payload as text:\n%s", s)
	}
	images("message page")
	shot("message")

	if code := click(`form[action="/console/cancel"] button`); code != 403 || !strings.Contains(text(), "Refused") {
		t.Errorf("cancel without the token: %d, want 403 Refused", code)
	}
	shot("refused")
	if st := b.state(t, id); st != delayd.Pending {
		t.Fatalf("after the refused cancel: %s, want pending", st)
	}

	if err := chromedp.Do(ctx, chromedp.Navigate(b.srv.URL+"/console/login"), chromedp.SendKeys(chromedp.CSS(`input[name=token]`), token)); err != nil {
		t.Fatal(err)
	}
	if code := click(`main form[action="/console/login"] button`); code != 200 || !strings.Contains(text(), "actions allowed") {
		t.Fatalf("login: %d", code)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(b.srv.URL+"/console/target?subject="+target)); err != nil {
		t.Fatal(err)
	}
	click(`table a`)
	if code := click(`form[action="/console/cancel"] button`); code != 200 || !strings.Contains(text(), "delayd answered: cancelled") {
		t.Errorf("cancel after login: %d:\n%s", code, text())
	}
	shot("cancelled")
	if st := b.state(t, id); st != delayd.StateCancelled {
		t.Errorf("after the cancel: %s, want cancelled", st)
	}

	if err := chromedp.Do(ctx, chromedp.Navigate(b.srv.URL+"/console/target?subject="+target)); err != nil {
		t.Fatal(err)
	}
	click(`table a`) // m2, the only one left
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS(`input[name=in]`), "2h")); err != nil {
		t.Fatal(err)
	}
	if code := click(`form[action="/console/reschedule"] button`); code != 200 || !strings.Contains(text(), "delayd answered: rescheduled (due ") {
		t.Errorf("reschedule: %d, want delayd's answer, rescheduled with its due:\n%s", code, text())
	}
	shot("rescheduled")
	if st := b.state(t, "m2"); st != delayd.Pending {
		t.Errorf("m2 after the reschedule: %s, want pending (moved 2h on)", st)
	}
	if n := dialogs.Load(); n != 0 {
		t.Errorf("%d JavaScript dialogs opened: a published value ran as script", n)
	}
}

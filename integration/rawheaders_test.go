package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"net"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delayd/delayd/integration/internal/itest"
)

// rawUserHeaders is a header block's user lines as a non-Go publisher
// (nats.js, a raw client) may send them: values with leading, trailing and
// internal runs of spaces, an empty value, a tab, repeated keys with their
// values in order, and a key in odd case. nats.go's encoder cannot send
// them: it trims every value.
var rawUserHeaders = []string{
	"X-Trailing: trail   ",
	"X-Leading:    lead",
	"X-Empty:",
	"X-Empty-Space: ",
	"X-Internal: a   b  c",
	"X-Tab: \tt\t",
	"X-Rep: one",
	"X-Rep:  two ",
	"X-Rep:",
	"X-Rep: four",
	"x-OdD-cAsE: Odd  Value",
	"X-Unicode: héllo  wörld ✓",
}

// rawPublish publishes one message with a hand-written header block on a
// plain TCP connection speaking the NATS client protocol (HPUB), so that no
// client library touches the header bytes, and waits for the server's PONG.
func rawPublish(t *testing.T, serverURL, subject string, headerLines []string, data []byte) {
	t.Helper()
	u, err := url.Parse(serverURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn)
	if _, err := r.ReadString('\n'); err != nil { // INFO
		t.Fatal(err)
	}
	hdr := "NATS/1.0\r\n" + strings.Join(headerLines, "\r\n") + "\r\n\r\n"
	var b bytes.Buffer
	b.WriteString(`CONNECT {"verbose":false,"pedantic":false,"headers":true,"protocol":1}` + "\r\n")
	fmt.Fprintf(&b, "HPUB %s %d %d\r\n%s%s\r\nPING\r\n", subject, len(hdr), len(hdr)+len(data), hdr, data)
	if _, err := conn.Write(b.Bytes()); err != nil {
		t.Fatal(err)
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("raw publish: %v", err)
		}
		if strings.HasPrefix(line, "-ERR") {
			t.Fatalf("raw publish: %s", line)
		}
		if strings.HasPrefix(line, "PONG") {
			return
		}
	}
}

// headerLines splits a header block into its lines after NATS/1.0.
func headerLines(block []byte) []string {
	s := strings.TrimSuffix(string(block), "\r\n\r\n")
	lines := strings.Split(s, "\r\n")
	return lines[1:]
}

// natsGoEncoded is the header line nats.go v1.55.0 writes for a raw line
// "key:value" (Msg.headerBytes): the key, ": ", and the value with leading
// and trailing ASCII white space (space, tab, CR, LF) trimmed. This is
// what any client built on nats.go (delayd, the nats CLI) can publish.
func natsGoEncoded(line string) string {
	k, v, _ := strings.Cut(line, ":")
	return k + ": " + textproto.TrimString(v)
}

// checkStoredLines asserts that block holds exactly the lines want among
// its user (X-…) header lines: each byte for byte, a repeated key's values
// in the order given. Different keys may come in any order.
func checkStoredLines(t *testing.T, block []byte, want []string) {
	t.Helper()
	var user []string
	for _, l := range headerLines(block) {
		if len(l) >= 2 && strings.EqualFold(l[:2], "x-") {
			user = append(user, l)
		}
	}
	byKey := func(lines []string) map[string][]string {
		m := map[string][]string{}
		for _, l := range lines {
			k, _, _ := strings.Cut(l, ":")
			m[k] = append(m[k], l)
		}
		return m
	}
	g, w := byKey(user), byKey(want)
	for _, k := range slices.Sorted(maps.Keys(w)) {
		if !slices.Equal(g[k], w[k]) {
			t.Errorf("header %q: stored lines %q, want %q", k, g[k], w[k])
		}
	}
	if len(user) != len(want) {
		t.Errorf("stored %d user header lines, want %d: %q", len(user), len(want), user)
	}
	if t.Failed() {
		t.Logf("stored header block: %q", block)
	}
}

// TestHeaderBytesPreserved publishes, with a raw client, header values
// that nats.go would never send (surrounding white space, a value with no
// space after the colon, a tab) beside ones it sends as they are (an empty
// value, internal runs of spaces, repeated keys, a key in odd case), and
// reads the header block the target stream stored, undecoded.
//
// The server stores a raw header block byte for byte (the control stream).
// delayd republishes through nats.go, whose encoder trims every value: so
// every line nats.go can carry arrives byte for byte, and the others arrive
// exactly as nats.go encodes them, nothing more lost
// (docs/guide.md#what-the-target-receives). Checked at level 0, at level 2, through a cascade of
// hops, and into the dead-letter stream. Should a nats.go upgrade stop
// trimming, this test fails: the header-bytes paragraph of
// docs/guide.md#what-the-target-receives then changes.
func TestHeaderBytesPreserved(t *testing.T) {
	t.Parallel()
	b := itest.Setup(t)
	b.CreateStream("RAWHDR", "rawhdr.>")
	b.CreateStream("RAWCTL", "rawctl")
	b.StartDelayd("100ms 300ms 1s")

	var encoded []string
	verbatim := 0
	for _, l := range rawUserHeaders {
		encoded = append(encoded, natsGoEncoded(l))
		if natsGoEncoded(l) == l {
			verbatim++
		}
	}
	if verbatim < 5 || verbatim == len(rawUserHeaders) {
		t.Fatalf("%d of %d lines survive nats.go's encoder: the test needs both kinds", verbatim, len(rawUserHeaders))
	}

	t.Run("server stores raw bytes", func(t *testing.T) {
		rawPublish(t, b.Srv.ClientURL(), "rawctl", rawUserHeaders, []byte("payload"))
		itest.WaitFor(t, 10*time.Second, "control message", func() bool { return b.StreamCount("RAWCTL") == 1 })
		block := b.StoredHeaderBlock("RAWCTL", 1)
		if want := "NATS/1.0\r\n" + strings.Join(rawUserHeaders, "\r\n") + "\r\n\r\n"; string(block) != want {
			t.Errorf("stored header block %q, want %q", block, want)
		}
	})

	cases := []struct{ name, target, delay string }{
		{"level 0", "rawhdr.zero", "Delay-Level: 0"},
		{"level 2", "rawhdr.two", "Delay-Level: 2"},
		{"cascade", "rawhdr.cascade", "Delay-Duration: 1500ms"}, // 1s level, then hops through 300ms and 100ms
	}
	for _, c := range cases {
		rawPublish(t, b.Srv.ClientURL(), "delay."+c.target, append([]string{c.delay}, rawUserHeaders...), []byte("payload"))
	}
	rawPublish(t, b.Srv.ClientURL(), "delay.rawhdr.bad", append([]string{"Delay-Level: nope"}, rawUserHeaders...), []byte("payload"))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var seq uint64
			itest.WaitFor(t, 20*time.Second, "delivery to "+c.target, func() bool {
				for _, m := range b.StreamMsgs("RAWHDR") {
					if m.Subject == c.target {
						seq = m.Sequence
						return true
					}
				}
				return false
			})
			block := b.StoredHeaderBlock("RAWHDR", seq)
			checkStoredLines(t, block, encoded)
			if c.name == "cascade" && !strings.Contains(string(block), "\r\nDelay-Hops: ") {
				t.Errorf("no Delay-Hops: the message did not cascade: %q", block)
			}
		})
	}
	t.Run("dead letter", func(t *testing.T) {
		var seq uint64
		itest.WaitFor(t, 20*time.Second, "dead letter", func() bool {
			for _, m := range b.StreamMsgs("DELAYD_DLQ") {
				if m.Header.Get("Delay-Subject") == "delay.rawhdr.bad" {
					seq = m.Sequence
					return true
				}
			}
			return false
		})
		checkStoredLines(t, b.StoredHeaderBlock("DELAYD_DLQ", seq), encoded)
	})
}

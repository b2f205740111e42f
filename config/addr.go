package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// checkHostPort returns why addr is not host:port with port minPort to 65535, or "". The host may be empty (all
// interfaces).
func checkHostPort(addr string, minPort int) string {
	want := fmt.Sprintf("must be host:port with port %d to 65535", minPort)
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return want
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < minPort || n > 65535 || port[0] == '+' || port[0] == '-' {
		return want
	}
	return ""
}

// natsSchemes are the URL schemes nats.go accepts.
var natsSchemes = map[string]bool{"nats": true, "tls": true, "ws": true, "wss": true}

// validateNATSURL checks a comma-separated server list as nats.Connect reads it: entries trimmed, empty entries
// skipped, each a URL with scheme nats, tls, ws or wss or a bare host[:port], websocket and non-websocket not mixed.
func validateNATSURL(list string) error {
	if list == "" {
		return nil
	}
	var n, ws int
	for entry := range strings.SplitSeq(list, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		n++
		raw := entry
		if !strings.Contains(entry, "://") {
			raw = "nats://" + entry
		}
		u, err := url.Parse(raw)
		if err != nil || !natsSchemes[u.Scheme] || u.Hostname() == "" || strings.ContainsAny(u.Host, " \t") {
			return fmt.Errorf("%q is not a server URL (want nats://, tls://, ws:// or wss://host:port, or host:port, comma-separated)",
				RedactURLs(entry))
		}
		if p := u.Port(); p != "" {
			if port, err := strconv.Atoi(p); err != nil || port < 1 || port > 65535 {
				return fmt.Errorf("%q has a bad port (want 1 to 65535)", RedactURLs(entry))
			}
		}
		if u.Scheme == "ws" || u.Scheme == "wss" {
			ws++
		}
	}
	if n == 0 {
		return errors.New(`holds no server URL (want nats://host:port, comma-separated, or "" for the embedded server)`)
	}
	if ws != 0 && ws != n {
		return errors.New("mixes websocket (ws, wss) and non-websocket URLs, which nats.go rejects")
	}
	return nil
}

// RedactURLs returns a comma-separated list of server URLs with every secret replaced by "xxxxx": the password of
// user:password@, and a token@ (a user name without a password, which nats.go sends as a token). nats.go's own
// ConnectedUrlRedacted keeps a token; pass its result through RedactURLs before logging it.
func RedactURLs(list string) string {
	entries := strings.Split(list, ",")
	for i, entry := range entries {
		if u, err := url.Parse(strings.TrimSpace(entry)); err == nil && u.User != nil {
			if _, ok := u.User.Password(); ok {
				u.User = url.UserPassword(u.User.Username(), "xxxxx")
			} else {
				u.User = url.User("xxxxx")
			}
			entries[i] = u.String()
		}
	}
	return strings.Join(entries, ",")
}

// ValidatePrefix checks an ingress subject prefix. It must be a valid literal NATS subject: non-empty tokens separated
// by '.', with no wildcard '*' or '>', no whitespace, no control characters, and valid UTF-8. It must not overlap
// delayd's internal subjects ("delayd" and "delayd.…"), the system and JetStream API subjects (anything starting with
// '$'), or request-reply inboxes ("_INBOX" and "_INBOX.…"). Errors wrap [ErrInvalid].
func ValidatePrefix(p string) error {
	if reason := prefixReason(p); reason != "" {
		return fmt.Errorf("config: prefix %q: %s: %w", p, reason, ErrInvalid)
	}
	return nil
}

// prefixReason returns why p is not a valid ingress prefix (see [ValidatePrefix]), or "".
func prefixReason(p string) string {
	switch {
	case p == "":
		return "must not be empty"
	case !utf8.ValidString(p):
		return "must be valid UTF-8"
	case strings.IndexFunc(p, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return "must not contain whitespace or control characters"
	case strings.ContainsAny(p, "*>"):
		return "must be a literal subject, without wildcards '*' or '>'"
	case strings.HasPrefix(p, "$"):
		return "must not start with '$' (system and JetStream API subjects)"
	}
	for tok := range strings.SplitSeq(p, ".") {
		if tok == "" {
			return `must not have empty tokens (want tokens separated by single dots, e.g. "sched.in")`
		}
	}
	for _, reserved := range []string{"delayd", "_INBOX"} {
		if p == reserved || strings.HasPrefix(p, reserved+".") {
			return fmt.Sprintf("must not be %s or start with %s. (reserved subjects)", reserved, reserved)
		}
	}
	return ""
}

// Package console serves delayd's operators' console at /console/ on DELAYD_HTTP_ADDR (docs/operations.md#the-console):
// an overview of the whole deployment (level streams, routers, replicas, dead letters), read over NATS as delayctl
// reads it, and a target's pending messages (the list API) with cancel, reschedule and run now.
//
// Pages are html/template templates embedded in the binary; charts are inline SVG drawn by the server; nothing is
// fetched from the internet. Every value a user published (subjects, ids, headers, payloads) reaches a page only
// through html/template's escaping, never as template.HTML.
//
// Actions (POST only) need authentication: the [Config].Token as a bearer header or the login cookie, or, without a
// token, a loopback-only listener and a request from this host ([Config].Loopback). Every action form carries a CSRF
// token checked server-side, and every action is logged at INFO with what was done and by whom.
package console

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"errors"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

//go:embed templates/*.html
var templateFS embed.FS

// RequestTimeoutDefault is how long a page or an action waits for NATS at most ([Config].RequestTimeout).
const RequestTimeoutDefault = 5 * time.Second

// RefreshDefault is how often the overview page reloads itself ([Config].Refresh).
const RefreshDefault = 5 * time.Second

// Config configures a [Console].
type Config struct {
	// Token is the token actions need (DELAYD_CONSOLE_TOKEN): "Authorization: Bearer <token>", or the cookie the
	// login form sets. When set, every action needs it, whatever the listener.
	// Optional. Default "": actions only with Loopback.
	Token string
	// Loopback says the HTTP listener accepts loopback connections only (its address is a loopback IP; see
	// [LoopbackAddr]). Without a Token, actions are then allowed to requests from this host that name it in their
	// Host header and were not forwarded by a proxy (no Forwarded or X-Forwarded-For header); without a Token or
	// Loopback, every action is refused.
	// Optional. Default false.
	Loopback bool
	// RequestTimeout bounds each NATS request of a page or an action.
	// Optional. Default [RequestTimeoutDefault].
	RequestTimeout time.Duration
	// Refresh is how often the overview page reloads itself.
	// Optional. Default [RefreshDefault].
	Refresh time.Duration
	// Logger receives one INFO line per action ("console action"). Optional. Default: discard.
	Logger *slog.Logger
}

// Console is the console's HTTP handler. It is safe for concurrent use: [New] sets every field, and requests only
// read them; each request's state lives in that request.
type Console struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	cfg     Config
	logger  *slog.Logger
	pages   map[string]*template.Template // by page file name
	csrfKey []byte                        // signs CSRF tokens: from Token, else random per process
	mux     *http.ServeMux
}

// New returns the console of the delayd deployment nc reaches. Its errors are jetstream.New's.
func New(nc *nats.Conn, cfg Config) (*Console, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	cfg.RequestTimeout = cmp.Or(cfg.RequestTimeout, RequestTimeoutDefault)
	cfg.Refresh = cmp.Or(cfg.Refresh, RefreshDefault)
	c := &Console{nc: nc, js: js, cfg: cfg, logger: cfg.Logger, pages: map[string]*template.Template{}}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Token != "" {
		// Every replica behind one load balancer then accepts the others' CSRF tokens.
		m := hmac.New(sha256.New, []byte(cfg.Token))
		m.Write([]byte("delayd console csrf"))
		c.csrfKey = m.Sum(nil)
	} else {
		c.csrfKey = make([]byte, 32)
		_, _ = rand.Read(c.csrfKey) // never fails (crypto/rand)
	}
	for _, name := range []string{"overview.html", "target.html", "message.html", "result.html", "login.html"} {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name)
		if err != nil {
			return nil, err
		}
		c.pages[name] = t
	}
	c.mux = http.NewServeMux()
	c.mux.HandleFunc("GET /console/{$}", c.overview)
	c.mux.HandleFunc("GET /console/target", c.target)
	c.mux.HandleFunc("GET /console/message", c.message)
	c.mux.HandleFunc("GET /console/login", c.loginPage)
	c.mux.HandleFunc("POST /console/login", c.login)
	c.mux.HandleFunc("POST /console/logout", c.logout)
	c.mux.HandleFunc("POST /console/cancel", c.action(c.cancel))
	c.mux.HandleFunc("POST /console/reschedule", c.action(c.reschedule))
	c.mux.HandleFunc("POST /console/runnow", c.action(c.runNow))
	return c, nil
}

// ServeHTTP serves the console's pages under /console/.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// Nothing is loaded from elsewhere, and no page may be framed (clickjacking of the action buttons).
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	c.mux.ServeHTTP(w, r)
}

// LoopbackAddr reports whether addr, a listener's address, accepts loopback connections only: its IP is a loopback
// address (127.0.0.0/8, ::1). An unspecified address (0.0.0.0, ::) is not.
func LoopbackAddr(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// render writes page with data and status; a template error (a bug) is a 500.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page string, data map[string]any) {
	data["CSRF"] = c.csrfToken(w, r)
	data["Auth"] = c.authState(r)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := c.pages[page].ExecuteTemplate(w, "layout", data); err != nil {
		c.logger.Error("console: render", slog.String("page", page), slog.Any("error", err))
	}
}

// errNoToken is the refusal of an action without authentication.
var errNoToken = errors.New("actions need DELAYD_CONSOLE_TOKEN (an Authorization: Bearer header, or log in) or a loopback-only DELAYD_HTTP_ADDR")

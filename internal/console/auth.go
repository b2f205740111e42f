package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"
)

// The console's cookies: the CSRF token (double-submit: the cookie and each form's csrf field must hold the same
// token, signed by the console) and the login session.
const (
	csrfCookie    = "delayd_console_csrf"
	sessionCookie = "delayd_console_session"
	csrfField     = "csrf"
)

// authState is what the pages say about the viewer's rights.
type authState struct {
	LoggedIn  bool // the token came with the request
	TokenSet  bool // DELAYD_CONSOLE_TOKEN is set
	CanAct    bool // actions would be allowed
	Loopback  bool // the listener is loopback-only
	ActorText string
}

func (c *Console) authState(r *http.Request) authState {
	who, ok := c.authenticated(r)
	return authState{LoggedIn: ok && who != "loopback", TokenSet: c.cfg.Token != "", CanAct: ok, Loopback: c.cfg.Loopback, ActorText: who}
}

// authenticated returns how the request is allowed to act ("bearer token", "login cookie", "loopback"), or false:
// with a Token set only the token counts; without one, a request from this host to a loopback-only listener.
func (c *Console) authenticated(r *http.Request) (string, bool) {
	if c.cfg.Token != "" {
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && equal(tok, c.cfg.Token) {
			return "bearer token", true
		}
		if ck, err := r.Cookie(sessionCookie); err == nil && equal(ck.Value, c.session()) {
			return "login cookie", true
		}
		return "", false
	}
	if c.cfg.Loopback && localRequest(r) {
		return "loopback", true
	}
	return "", false
}

// localRequest reports whether r came from a loopback address, names a loopback host (a DNS rebinding page names
// its own), and was not forwarded by a reverse proxy on this host.
func localRequest(r *http.Request) bool {
	if r.Header.Get("Forwarded") != "" || r.Header.Get("X-Forwarded-For") != "" {
		return false
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return false
	}
	h := r.Host
	if hh, _, err := net.SplitHostPort(h); err == nil {
		h = hh
	}
	h = strings.Trim(h, "[]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// session is the login cookie's value: derived from the token, so the cookie is not the token itself.
func (c *Console) session() string {
	m := hmac.New(sha256.New, []byte(c.cfg.Token))
	m.Write([]byte("delayd console session"))
	return hex.EncodeToString(m.Sum(nil))
}

// csrfToken returns the request's CSRF token, setting a new cookie when it has no valid one.
func (c *Console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(csrfCookie); err == nil && c.validCSRF(ck.Value) {
		return ck.Value
	}
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	tok := hex.EncodeToString(nonce) + "." + c.sign(hex.EncodeToString(nonce))
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: tok, Path: "/console/", HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
	return tok
}

func (c *Console) sign(nonce string) string {
	m := hmac.New(sha256.New, c.csrfKey)
	m.Write([]byte(nonce))
	return hex.EncodeToString(m.Sum(nil))
}

// validCSRF reports whether tok is a token this console signed.
func (c *Console) validCSRF(tok string) bool {
	nonce, sig, ok := strings.Cut(tok, ".")
	return ok && len(nonce) == 32 && equal(sig, c.sign(nonce))
}

// checkCSRF reports whether r's form field and cookie hold the same token, signed by this console.
func (c *Console) checkCSRF(r *http.Request) bool {
	ck, err := r.Cookie(csrfCookie)
	if err != nil {
		return false
	}
	field := r.PostFormValue(csrfField)
	return field != "" && equal(field, ck.Value) && c.validCSRF(field)
}

func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// actor names who acted, for the action log: how they were authenticated and from where.
func actor(r *http.Request, how string) slog.Attr {
	return slog.Group("by", slog.String("auth", how), slog.String("remote", r.RemoteAddr),
		slog.String("forwarded_for", r.Header.Get("X-Forwarded-For")), slog.String("user_agent", r.UserAgent()))
}

// action wraps an action handler: POST only (the mux), authenticated, with a valid CSRF token. A refusal is a 403
// page saying why, and is logged.
func (c *Console) action(do func(w http.ResponseWriter, r *http.Request, by slog.Attr)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		how, ok := c.authenticated(r)
		if !ok {
			c.logger.Info("console action refused", slog.String("path", r.URL.Path), slog.String("why", "not authenticated"), actor(r, "none"))
			c.render(w, r, http.StatusForbidden, "result.html", map[string]any{"Title": "Refused", "Refused": errNoToken.Error()})
			return
		}
		if !c.checkCSRF(r) {
			c.logger.Info("console action refused", slog.String("path", r.URL.Path), slog.String("why", "bad CSRF token"), actor(r, how))
			c.render(w, r, http.StatusForbidden, "result.html", map[string]any{"Title": "Refused",
				"Refused": "the form's CSRF token is missing or wrong: reload the page and try again"})
			return
		}
		do(w, r, actor(r, how))
	}
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "login.html", map[string]any{"Title": "Log in"})
}

// login checks the form's token and sets the session cookie (HttpOnly, SameSite=Strict, Secure over HTTPS).
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 1<<16)
	if !c.checkCSRF(r) {
		c.render(w, r, http.StatusForbidden, "login.html", map[string]any{"Title": "Log in", "Error": "the form's CSRF token is missing or wrong: reload the page"})
		return
	}
	if c.cfg.Token == "" || !equal(r.PostFormValue("token"), c.cfg.Token) {
		c.logger.Info("console login refused", actor(r, "token form"))
		c.render(w, r, http.StatusForbidden, "login.html", map[string]any{"Title": "Log in", "Error": "wrong token (DELAYD_CONSOLE_TOKEN)"})
		return
	}
	c.logger.Info("console login", actor(r, "token form"))
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: c.session(), Path: "/console/", HttpOnly: true, Secure: secure(r),
		SameSite: http.SameSiteStrictMode, Expires: time.Now().Add(12 * time.Hour)})
	http.Redirect(w, r, "/console/", http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if c.checkCSRF(r) {
		http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/console/", MaxAge: -1})
	}
	http.Redirect(w, r, "/console/", http.StatusSeeOther)
}

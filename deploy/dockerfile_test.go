package deploy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"go/parser"
	"go/token"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// instruction is one Dockerfile instruction: its keyword (upper case) and its arguments, continuation lines joined.
type instruction struct {
	cmd, args string
}

// stage is one FROM … stage of the Dockerfile.
type stage struct {
	image, name string
	inst        []instruction
}

// readDockerfile parses ../Dockerfile into stages.
func readDockerfile(t *testing.T) []stage {
	t.Helper()
	f, err := os.Open("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		stages []stage
		cur    string
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cur == "" && (line == "" || line[0] == '#') {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			cur += strings.TrimSuffix(line, `\`) + " "
			continue
		}
		line, cur = cur+line, ""
		cmd, args, _ := strings.Cut(line, " ")
		in := instruction{strings.ToUpper(cmd), strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			fields := strings.Fields(in.args)
			s := stage{image: fields[0]}
			if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
				s.name = fields[2]
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) == 0 {
			t.Fatalf("Dockerfile: %s before FROM", in.cmd)
		}
		stages[len(stages)-1].inst = append(stages[len(stages)-1].inst, in)
	}
	if len(stages) < 2 {
		t.Fatalf("Dockerfile has %d stages, want a build stage and a runtime stage", len(stages))
	}
	return stages
}

// shellWords splits a RUN command into words, honouring single and double quotes (enough for a go build line).
func shellWords(s string) []string {
	var (
		words []string
		w     strings.Builder
		quote rune
		in    bool
	)
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// goBuild is the build stage's go build command: its flags (without -o), its output directory and its packages.
type goBuild struct {
	flags    []string
	out      string
	packages []string
	cgoOff   bool // CGO_ENABLED=0 in the stage's ENV or on the command
}

// envVars parses an ENV instruction's key=value pairs.
func envVars(args string) map[string]string {
	env := map[string]string{}
	for _, w := range shellWords(args) {
		if k, v, ok := strings.Cut(w, "="); ok {
			env[k] = v
		}
	}
	return env
}

// findGoBuild returns the go build command of the stage that has one.
func findGoBuild(t *testing.T, stages []stage) (stage, goBuild) {
	t.Helper()
	for _, s := range stages {
		env := map[string]string{}
		for _, in := range s.inst {
			switch in.cmd {
			case "ENV":
				for k, v := range envVars(in.args) {
					env[k] = v
				}
			case "RUN":
				for cmd := range strings.SplitSeq(in.args, "&&") {
					words := shellWords(strings.TrimSpace(cmd))
					var b goBuild
					b.cgoOff = env["CGO_ENABLED"] == "0"
					for len(words) > 0 && strings.Contains(words[0], "=") {
						if words[0] == "CGO_ENABLED=0" {
							b.cgoOff = true
						}
						words = words[1:]
					}
					if len(words) < 2 || words[0] != "go" || words[1] != "build" {
						continue
					}
					for i := 2; i < len(words); i++ {
						switch w := words[i]; {
						case w == "-o" && i+1 < len(words):
							b.out = words[i+1]
							i++
						case slices.Contains([]string{"-ldflags", "-gcflags", "-tags", "-mod", "-p"}, w) && i+1 < len(words):
							b.flags = append(b.flags, w, words[i+1])
							i++
						case strings.HasPrefix(w, "-"):
							b.flags = append(b.flags, w)
						default:
							b.packages = append(b.packages, w)
						}
					}
					return s, b
				}
			}
		}
	}
	t.Fatal("Dockerfile: no RUN go build command")
	return stage{}, goBuild{}
}

// goModVersion returns go.mod's go directive.
func goModVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "go "); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("go.mod has no go directive")
	return ""
}

// TestDockerfile checks what can be checked of the Dockerfile without a container engine: the build stage is golang
// at go.mod's version; its go build builds, with CGO_ENABLED=0, packages that are commands under cmd/; the runtime
// stage copies those binaries, runs one of them as a non-root user, exposes the HTTP port of its DELAYD_HTTP_ADDR,
// and its DELAYD_ variables are ones config reads and accepts, with the embedded store in a volume.
func TestDockerfile(t *testing.T) {
	stages := readDockerfile(t)
	buildStage, b := findGoBuild(t, stages)
	if img, tag, _ := strings.Cut(buildStage.image, ":"); img != "golang" || strings.SplitN(tag, "-", 2)[0] != goModVersion(t) {
		t.Errorf("build stage FROM %s: want golang:%s (go.mod's go version)", buildStage.image, goModVersion(t))
	}
	if !b.cgoOff {
		t.Error("the go build command does not build with CGO_ENABLED=0: the binaries would not be static")
	}
	if len(b.packages) == 0 {
		t.Fatal("the go build command names no packages")
	}
	built := map[string]bool{}
	for _, p := range b.packages {
		if !strings.HasPrefix(p, "./cmd/") {
			t.Errorf("go build %s: want a command under ./cmd/", p)
			continue
		}
		files, _ := filepath.Glob(filepath.Join("..", p, "*.go"))
		isMain := false
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.PackageClauseOnly)
			if err == nil && af.Name.Name == "main" {
				isMain = true
			}
		}
		if !isMain {
			t.Errorf("go build %s: no package main there", p)
		}
		built[path.Base(p)] = true
	}
	for _, want := range []string{"delayd", "delayctl"} {
		if !built[want] {
			t.Errorf("the go build command does not build %s", want)
		}
	}

	rt := stages[len(stages)-1]
	if rt.name == buildStage.name && rt.image == buildStage.image {
		t.Fatal("the runtime stage is the build stage")
	}
	var (
		user, entrypoint string
		env              = map[string]string{}
		exposed, volumes []string
		copied           = map[string]bool{}
	)
	for _, in := range rt.inst {
		switch in.cmd {
		case "USER":
			user = in.args
		case "ENV":
			for k, v := range envVars(in.args) {
				env[k] = v
			}
		case "EXPOSE":
			exposed = append(exposed, strings.Fields(in.args)...)
		case "VOLUME":
			volumes = append(volumes, strings.Fields(in.args)...)
		case "ENTRYPOINT":
			var argv []string
			if err := json.Unmarshal([]byte(in.args), &argv); err != nil || len(argv) == 0 {
				t.Errorf("ENTRYPOINT %s: want the exec form, [\"/path/delayd\"]", in.args)
			} else {
				entrypoint = argv[0]
			}
		case "COPY":
			words := strings.Fields(in.args)
			if len(words) > 1 && words[0] == "--from="+buildStage.name {
				for _, src := range words[1 : len(words)-1] {
					if !strings.HasPrefix(src, "--") && strings.HasPrefix(src, b.out) && built[path.Base(src)] {
						copied[path.Base(src)] = true
					}
				}
			}
		case "RUN":
			t.Errorf("runtime stage RUN %s: a static runtime image has no shell; prepare files in the build stage", in.args)
		}
	}
	if u, _, _ := strings.Cut(user, ":"); u == "" || u == "root" || u == "0" {
		t.Errorf("runtime stage USER %q: want a non-root user", user)
	}
	for name := range built {
		if !copied[name] {
			t.Errorf("the runtime stage does not copy %s from %s", name, b.out)
		}
	}
	if path.Base(entrypoint) != "delayd" || !copied["delayd"] {
		t.Errorf("ENTRYPOINT %q: want the copied delayd binary", entrypoint)
	}
	if checkVars(t, "Dockerfile", env) {
		if err := loadConfig(t, env); err != nil {
			t.Errorf("Dockerfile: delayd refuses the image's environment: %v", err)
		}
	}
	if _, port, err := net.SplitHostPort(env["DELAYD_HTTP_ADDR"]); err != nil || !slices.Contains(exposed, port) {
		t.Errorf("DELAYD_HTTP_ADDR %q: want a port the image EXPOSEs (%v)", env["DELAYD_HTTP_ADDR"], exposed)
	}
	if dir := env["DELAYD_STORE_DIR"]; dir == "" || !slices.Contains(volumes, dir) {
		t.Errorf("DELAYD_STORE_DIR %q: want it set to a VOLUME (%v), so the embedded store outlives the container", dir, volumes)
	}
}

// TestDockerfileBuildsAndRuns runs the Dockerfile's go build command (its flags and packages, CGO_ENABLED=0) on this
// checkout, checks the binaries are static (go version -m: CGO_ENABLED=0), then starts the built delayd in embedded
// mode and asks it the Deployment's probe paths: each must answer 200 (/readyz once ready), never 404. Last, SIGTERM
// must stop it with status 0 within the Deployment's terminationGracePeriodSeconds. No image is built: the machine
// this was written on has no container engine.
func TestDockerfileBuildsAndRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds delayd and delayctl with CGO_ENABLED=0 (minutes on a cold build cache) and runs delayd")
	}
	_, b := findGoBuild(t, readDockerfile(t))
	out := t.TempDir()
	args := append(append([]string{"build"}, b.flags...), "-o", out+string(filepath.Separator))
	args = append(args, b.packages...)
	// Bounded below go test's own timeout, so that a build on a starved machine fails here and stops its go command.
	bctx, bcancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer bcancel()
	cmd := exec.CommandContext(bctx, "go", args...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, msg)
	}
	for _, p := range b.packages {
		bin := filepath.Join(out, path.Base(p))
		info, err := exec.Command("go", "version", "-m", bin).Output()
		if err != nil {
			t.Fatalf("go version -m %s: %v", bin, err)
		}
		if !strings.Contains(string(info), "CGO_ENABLED=0") {
			t.Errorf("%s was not built with CGO_ENABLED=0:\n%s", bin, info)
		}
	}

	_, c := deployment(t, readObjects(t))
	var probePaths []string
	for _, p := range []*probe{c.LivenessProbe, c.ReadinessProbe} {
		if p != nil && p.HTTPGet != nil {
			probePaths = append(probePaths, p.HTTPGet.Path)
		}
	}
	d, _ := deployment(t, readObjects(t))
	grace := 30 * time.Second
	if s := d.Spec.Template.Spec.TerminationGracePeriodSeconds; s != nil {
		grace = time.Duration(*s) * time.Second
	}

	// Embedded mode on loopback: the NATS URL and credentials of the Deployment need a cluster.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	natsAddr := ln.Addr().String()
	ln.Close()
	delayd := exec.Command(filepath.Join(out, "delayd"))
	delayd.Env = []string{"DELAYD_HTTP_ADDR=127.0.0.1:0", "DELAYD_LISTEN=" + natsAddr,
		"DELAYD_STORE_DIR=" + t.TempDir(), "DELAYD_LOG_FORMAT=json", "DELAYD_LEVELS=1s 5s"}
	stderr, err := delayd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := delayd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	waited := make(chan struct{})
	addr := make(chan string, 1)
	go func() {
		defer close(waited)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "http endpoints" {
				addr <- rec.Addr
			}
		}
		exited <- delayd.Wait()
	}()
	t.Cleanup(func() {
		_ = delayd.Process.Kill() // an error if it has exited already
		<-waited
	})
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case err := <-exited:
		t.Fatalf("delayd exited before serving HTTP: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("delayd did not log its http endpoints within 30s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, p := range probePaths {
		for {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+p, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("GET %s: %v", p, err)
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			if resp.StatusCode == http.StatusNotFound {
				t.Fatalf("GET %s: 404: the Deployment probes a path delayd does not serve", p)
			}
			select {
			case <-ctx.Done():
				t.Fatalf("GET %s: %d, not 200 within 30s", p, resp.StatusCode)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}

	if err := delayd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("delayd after SIGTERM: %v, want exit status 0", err)
		}
	case <-time.After(grace):
		t.Errorf("delayd did not exit within the Deployment's grace period %s after SIGTERM", grace)
	}
	t.Logf("probes %v answered 200 at %s", probePaths, base)
}

package deploy_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// object is one Kubernetes object of deploy/k8s, as far as the checks read it.
type object struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Replicas     *int          `yaml:"replicas"`
		MinAvailable *int          `yaml:"minAvailable"`
		Selector     yaml.Node     `yaml:"selector"`
		Template     podTemplate   `yaml:"template"`
		Ports        []servicePort `yaml:"ports"`
	} `yaml:"spec"`
	file string
}

type podTemplate struct {
	Metadata struct {
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Spec struct {
		TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
		SecurityContext               struct {
			RunAsNonRoot *bool `yaml:"runAsNonRoot"`
			RunAsUser    *int  `yaml:"runAsUser"`
		} `yaml:"securityContext"`
		Containers []container `yaml:"containers"`
		Volumes    []struct {
			Name   string `yaml:"name"`
			Secret *struct {
				SecretName string `yaml:"secretName"`
			} `yaml:"secret"`
		} `yaml:"volumes"`
	} `yaml:"spec"`
}

type container struct {
	Name  string `yaml:"name"`
	Image string `yaml:"image"`
	Env   []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name string `yaml:"name"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

type servicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort any    `yaml:"targetPort"`
}

// readObjects parses every YAML document of every deploy/k8s/*.yaml file but kustomization.yaml (fields the checks
// do not read are ignored).
func readObjects(t *testing.T) []object {
	t.Helper()
	files, err := filepath.Glob("k8s/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no deploy/k8s/*.yaml files: %v", err)
	}
	var objs []object
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var o object
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			o.file = f
			objs = append(objs, o)
		}
	}
	return objs
}

// deployment returns the one Deployment of deploy/k8s and its delayd container.
func deployment(t *testing.T, objs []object) (object, container) {
	t.Helper()
	var found []object
	for _, o := range objs {
		if o.Kind == "Deployment" {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("deploy/k8s has %d Deployments, want 1", len(found))
	}
	d := found[0]
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == "delayd" {
			return d, c
		}
	}
	t.Fatalf("%s: no container named delayd", d.file)
	return object{}, container{}
}

// containerEnv is the container's env as a map.
func containerEnv(c container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	return env
}

// matchLabels returns a selector's matchLabels.
func matchLabels(t *testing.T, o object) map[string]string {
	t.Helper()
	var sel struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	}
	if err := o.Spec.Selector.Decode(&sel); err != nil || len(sel.MatchLabels) == 0 {
		t.Fatalf("%s %s: no spec.selector.matchLabels (%v)", o.file, o.Kind, err)
	}
	return sel.MatchLabels
}

// selects reports whether every label of sel is on labels.
func selects(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// TestK8sManifests checks deploy/k8s: every DELAYD_ variable the Deployment sets is one config reads, and config
// loads them; the Deployment, PodDisruptionBudget and Service select the same pods; probes and the Service name the
// container's port, which is the port of DELAYD_HTTP_ADDR; the pod runs as non-root with resources set. (That the
// probe paths are ones delayd serves is checked against a running delayd by TestDockerfileBuildsAndRuns.)
func TestK8sManifests(t *testing.T) {
	objs := readObjects(t)
	d, c := deployment(t, objs)
	env := containerEnv(c)
	if checkVars(t, d.file, env) {
		if err := loadConfig(t, env); err != nil {
			t.Errorf("%s: delayd refuses the container's environment: %v", d.file, err)
		}
	}
	for _, want := range []string{"DELAYD_NATS_URL", "DELAYD_REPLICAS", "DELAYD_HTTP_ADDR"} {
		if env[want] == "" {
			t.Errorf("%s: the delayd container does not set %s", d.file, want)
		}
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("%s: replicas %v, want 3", d.file, d.Spec.Replicas)
	}

	// The HTTP listener, its container port, the probes and the Service agree.
	_, httpPort, err := net.SplitHostPort(env["DELAYD_HTTP_ADDR"])
	if err != nil {
		t.Fatalf("%s: DELAYD_HTTP_ADDR %q: %v", d.file, env["DELAYD_HTTP_ADDR"], err)
	}
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if strconv.Itoa(ports["http"]) != httpPort {
		t.Errorf("%s: container port http is %d, DELAYD_HTTP_ADDR listens on %s", d.file, ports["http"], httpPort)
	}
	for _, pr := range []struct {
		name string
		p    *probe
	}{{"livenessProbe", c.LivenessProbe}, {"readinessProbe", c.ReadinessProbe}} {
		if pr.p == nil || pr.p.HTTPGet == nil || pr.p.HTTPGet.Path == "" {
			t.Errorf("%s: %s is not an httpGet with a path", d.file, pr.name)
			continue
		}
		if name, ok := pr.p.HTTPGet.Port.(string); !ok || ports[name] == 0 {
			t.Errorf("%s: %s port %v is not a named container port", d.file, pr.name, pr.p.HTTPGet.Port)
		}
	}

	// Non-root, resources, a grace period as long as the systemd unit's stop timeout.
	ps := d.Spec.Template.Spec
	if ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot || ps.SecurityContext.RunAsUser == nil || *ps.SecurityContext.RunAsUser == 0 {
		t.Errorf("%s: the pod's securityContext must set runAsNonRoot: true and a non-zero runAsUser", d.file)
	}
	if c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation {
		t.Errorf("%s: the container must set allowPrivilegeEscalation: false", d.file)
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("%s: the container must request cpu and memory and limit memory: %+v", d.file, c.Resources)
	}
	unit := readUnit(t)
	if stop := unit["TimeoutStopSec"]; len(stop) != 1 || ps.TerminationGracePeriodSeconds == nil || strconv.Itoa(*ps.TerminationGracePeriodSeconds) != stop[0] {
		t.Errorf("%s: terminationGracePeriodSeconds %v, want the systemd unit's TimeoutStopSec %v (one shutdown budget)", d.file, ps.TerminationGracePeriodSeconds, stop)
	}
	volumes := map[string]bool{}
	for _, v := range ps.Volumes {
		volumes[v.Name] = true
	}
	for _, m := range c.VolumeMounts {
		if !volumes[m.Name] {
			t.Errorf("%s: volumeMount %s names no volume", d.file, m.Name)
		}
	}

	// The PodDisruptionBudget and the Service select the Deployment's pods.
	labels := d.Spec.Template.Metadata.Labels
	if !selects(matchLabels(t, d), labels) {
		t.Errorf("%s: the Deployment's selector does not select its own pods' labels %v", d.file, labels)
	}
	kinds := map[string]bool{}
	for _, o := range objs {
		kinds[o.Kind] = true
		switch o.Kind {
		case "PodDisruptionBudget":
			if !selects(matchLabels(t, o), labels) {
				t.Errorf("%s: the PodDisruptionBudget does not select the Deployment's pods %v", o.file, labels)
			}
			if o.Spec.MinAvailable == nil || *o.Spec.MinAvailable < 1 || *o.Spec.MinAvailable >= *d.Spec.Replicas {
				t.Errorf("%s: minAvailable %v, want 1 to replicas-1 (%d)", o.file, o.Spec.MinAvailable, *d.Spec.Replicas-1)
			}
		case "Service":
			var sel map[string]string
			if err := o.Spec.Selector.Decode(&sel); err != nil || !selects(sel, labels) {
				t.Errorf("%s: the Service's selector %v does not select the Deployment's pods %v", o.file, sel, labels)
			}
			for _, p := range o.Spec.Ports {
				if name, ok := p.TargetPort.(string); !ok || ports[name] == 0 {
					t.Errorf("%s: Service port %s targets %v, not a named container port", o.file, p.Name, p.TargetPort)
				}
			}
		}
	}
	for _, want := range []string{"Deployment", "PodDisruptionBudget", "Service"} {
		if !kinds[want] {
			t.Errorf("deploy/k8s has no %s", want)
		}
	}
}

// TestKustomization: deploy/k8s/kustomization.yaml lists every manifest of the directory, and only those.
func TestKustomization(t *testing.T) {
	data, err := os.ReadFile("k8s/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `yaml:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("k8s/*.yaml")
	want := map[string]bool{}
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			want[b] = true
		}
	}
	for _, r := range k.Resources {
		if !want[r] {
			t.Errorf("kustomization.yaml lists %s, which is not a manifest in deploy/k8s", r)
		}
		delete(want, r)
	}
	for f := range want {
		t.Errorf("kustomization.yaml does not list deploy/k8s/%s", f)
	}
}

// readUnit parses deploy/systemd/delayd.service into its keys' values (every section; repeated keys append).
func readUnit(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open("systemd/delayd.service")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	unit := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("systemd/delayd.service: not a key=value line: %q", line)
		}
		unit[strings.TrimSpace(k)] = append(unit[strings.TrimSpace(k)], strings.TrimSpace(v))
	}
	return unit
}

// readEnvFile parses an EnvironmentFile: VAR=value lines, # comments, values optionally in matching quotes.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: not a VAR=value line: %q", path, line)
		}
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		env[k] = v
	}
	return env
}

// TestSystemdUnit checks deploy/systemd: every DELAYD_ variable of the unit's Environment= lines and of the example
// env file is one config reads, and config loads them together; the unit reads the env file from where its header
// says to put it, restarts delayd, and stops it with SIGTERM.
func TestSystemdUnit(t *testing.T) {
	unit := readUnit(t)
	env := readEnvFile(t, "systemd/delayd.env")
	for _, line := range unit["Environment"] {
		for _, kv := range strings.Fields(line) {
			k, v, _ := strings.Cut(strings.Trim(kv, `"`), "=")
			env[k] = v
		}
	}
	if checkVars(t, "deploy/systemd", env) {
		if err := loadConfig(t, env); err != nil {
			t.Errorf("deploy/systemd: delayd refuses the unit's environment with delayd.env: %v", err)
		}
	}
	for key, want := range map[string]string{
		"ExecStart":       "/usr/local/bin/delayd",
		"EnvironmentFile": "/etc/delayd/env",
		"Restart":         "always",
		"KillSignal":      "SIGTERM",
	} {
		if got := unit[key]; len(got) != 1 || got[0] != want {
			t.Errorf("delayd.service: %s=%v, want %s", key, got, want)
		}
	}
}

// Package deploy_test checks the deployment files under deploy/ and the repository's Dockerfile against delayd
// itself: the Grafana dashboard's queries name only metrics delayd exports, the Kubernetes manifests and the systemd
// unit set only DELAYD_ variables config reads (and values it accepts), and the Dockerfile builds static binaries of
// real commands and runs them as a non-root user. See docs/operations.md#deployment-files.
package deploy_test

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/delayd/delayd/config"
)

// configVars returns every variable delayd reads: the envconfig tags of config.Config.
func configVars(t *testing.T) map[string]bool {
	t.Helper()
	vars := map[string]bool{}
	// VisibleFields: the fields of Config's embedded structs (NATSAuth, TargetLists) are variables too.
	for _, f := range reflect.VisibleFields(reflect.TypeFor[config.Config]()) {
		if name := f.Tag.Get("envconfig"); name != "" {
			vars[name] = true
		}
	}
	if len(vars) < 10 {
		t.Fatalf("config.Config has %d envconfig tags: the reflection no longer finds them", len(vars))
	}
	return vars
}

// checkVars fails for every DELAYD_ variable of env that config does not read, and returns whether all were known.
func checkVars(t *testing.T, where string, env map[string]string) bool {
	t.Helper()
	known := configVars(t)
	ok := true
	for name := range env {
		if strings.HasPrefix(name, "DELAYD_") && !known[name] {
			t.Errorf("%s sets %s, which delayd does not read (config.Config has no such envconfig tag): a misspelling is silently ignored", where, name)
			ok = false
		}
	}
	return ok
}

// loadConfig runs config.Load with exactly env's DELAYD_ variables set (others unset) and returns its errors, but
// for files that do not exist here: credentials and certificates are installed where the files say at deployment
// (a Secret's volume, /etc/delayd). It uses t.Setenv, so its test must not be parallel.
func loadConfig(t *testing.T, env map[string]string) error {
	t.Helper()
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "DELAYD_") {
			t.Setenv(name, "") // restored at cleanup
			os.Unsetenv(name)
		}
	}
	for name, value := range env {
		if strings.HasPrefix(name, "DELAYD_") {
			t.Setenv(name, value)
		}
	}
	_, err := config.Load()
	var errs []error
	for _, e := range flatten(err) {
		if ve, ok := errors.AsType[*config.VarError](e); ok && ve.Reason == "file does not exist" {
			continue
		}
		errs = append(errs, e)
	}
	return errors.Join(errs...)
}

// flatten returns the errors errors.Join joined in err, or err itself.
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

package itest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// binDirs are the temporary folders of the binaries this test binary built;
// [Main] removes them when its tests end.
var binDirs struct {
	mu   sync.Mutex
	dirs []string
}

// BuildBinary builds the Go package pkg (an import path of this module or
// of its dependencies, at go.mod's versions) into a new temporary folder
// and returns the binary's path, with the race detector if race is true.
// The folder is removed by [Main] when the test binary ends.
func BuildBinary(pkg, name string, race bool) (string, error) {
	dir, err := os.MkdirTemp("", name+"-bin-")
	if err != nil {
		return "", err
	}
	binDirs.mu.Lock()
	binDirs.dirs = append(binDirs.dirs, dir)
	binDirs.mu.Unlock()
	bin := filepath.Join(dir, name)
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, pkg)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin, nil
}

// Main runs the package's tests and then removes the binaries they built
// ([BuildBinary]), and returns the exit code for os.Exit. Every test
// package that builds binaries through this package calls it from its
// TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(itest.Main(m)) }
func Main(m *testing.M) int {
	code := m.Run()
	binDirs.mu.Lock()
	defer binDirs.mu.Unlock()
	for _, dir := range binDirs.dirs {
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintf(os.Stderr, "itest: remove %s: %v\n", dir, err)
		}
	}
	binDirs.dirs = nil
	return code
}

// DelaydBinary builds cmd/delayd once per test binary, with the race
// detector only if the test binary has it ([Race]): a plain go test runs
// delayd processes as fast as its in-process services.
var DelaydBinary = sync.OnceValues(func() (string, error) {
	return BuildBinary("github.com/delayd/delayd/cmd/delayd", "delayd", Race)
})

// delayctlBinary builds cmd/delayctl once per test binary.
var delayctlBinary = sync.OnceValues(func() (string, error) {
	return BuildBinary("github.com/delayd/delayd/cmd/delayctl", "delayctl", false)
})

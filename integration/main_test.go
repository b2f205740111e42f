package integration

import (
	"os"
	"testing"

	"github.com/delayd/delayd/integration/internal/itest"
)

// TestMain removes the binaries the tests built (delayd, delayctl) when
// they end.
func TestMain(m *testing.M) { os.Exit(itest.Main(m)) }

// Package docscheck holds a test that keeps the documentation's references
// honest: every docs path and heading a Go comment cites exists, and so
// does every one the Dockerfile and the deploy/ files (systemd unit,
// Kubernetes manifests, Grafana dashboard) cite, every
// relative link between the Markdown pages resolves, and README.md stays a
// short front door (at most [READMEMaxLines] lines). See
// docs/development.md#documentation.
package docscheck

// READMEMaxLines is the most lines README.md may have: the front door of
// docs/ (issue 20), with the rest in the docs/ pages.
const READMEMaxLines = 300

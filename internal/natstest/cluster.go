package natstest

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Account is the account that clients without credentials use, as
// nats-server names it ("$G"). Cluster's leader look-ups take stream names
// in this account.
const Account = "$G"

// ClusterReadyTimeout bounds how long [StartCluster] and
// [Cluster.Restart] wait for a meta leader and every running node to be
// current.
const ClusterReadyTimeout = 30 * time.Second

// Cluster is a JetStream cluster of embedded nats-servers on loopback, as
// nats-server's own createJetStreamClusterExplicit builds one: each node
// has a name, a store dir, a cluster listen port and routes to every
// node's cluster port. Ports are chosen free by the OS once, at start,
// and kept across [Cluster.Restart], so clients given [Cluster.URLs]
// reconnect to a restarted node.
//
// A Cluster belongs to one test goroutine.
type Cluster struct {
	t       testing.TB
	opts    []*server.Options
	servers []*server.Server // nil for a stopped node
}

// ClusterOption changes node i's options before [StartCluster] starts it
// the first time; [Cluster.Restart] reuses them.
type ClusterOption func(i int, o *server.Options)

// NoAdvertise keeps every node from telling its clients the other nodes'
// client URLs (nats-server's cluster no_advertise), so a client knows only
// the URLs it was given. A test that puts a proxy between a client and the
// cluster needs it: otherwise the client learns the nodes' real addresses
// from the INFO it reads through the proxy, and reconnects around a cut.
func NoAdvertise(_ int, o *server.Options) { o.Cluster.NoAdvertise = true }

// PingInterval returns an option that makes every node ping its clients
// every interval and close a client's connection as stale once maxOut
// pings are unanswered (nats-server's ping_interval and ping_max; the
// defaults are 2 minutes and 2). A test that stops a client process
// (SIGSTOP) for longer than about interval × (maxOut + 1) sees the server
// close its connection, as a client gone quiet in production would after
// 4 to 6 minutes.
func PingInterval(interval time.Duration, maxOut int) ClusterOption {
	return func(_ int, o *server.Options) {
		o.PingInterval, o.MaxPingsOut = interval, maxOut
	}
}

// StartCluster starts n nodes (n >= 1; 3 for R3 streams), each with its
// options changed by opts in order, waits until they form a cluster with a
// JetStream meta leader and every node is current (up to
// [ClusterReadyTimeout]), and shuts every node down when the test ends.
// The nodes' options are [ClusterOptions]'s.
func StartCluster(t testing.TB, n int, opts ...ClusterOption) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("natstest: cluster of %d nodes", n)
	}
	name := "C" + strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	if len(name) > 60 {
		name = name[:60]
	}
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	nodeOpts, err := ClusterOptions(name, dirs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, opts: nodeOpts, servers: make([]*server.Server, n)}
	t.Cleanup(func() {
		for i := range c.servers {
			c.Stop(i)
		}
	})
	for i := range n {
		c.start(i)
	}
	c.WaitReady()
	return c
}

// ClusterOptions returns the options of the nodes of a cluster named name,
// one node per store directory (len(storeDirs) nodes), as [StartCluster]
// starts them; it is also the entry point for programs that are not tests
// (cmd/delaybench), which start the servers themselves and wait on
// [ClusterReady]. Node i is [Options](storeDirs[i]) named "N<i>", with a
// client port and a cluster port on loopback that the OS reports free now,
// and routes to every node's cluster port; opts then change it in order.
// It returns an error for an empty name or no store directory, or if no
// free port can be found.
func ClusterOptions(name string, storeDirs []string, opts ...ClusterOption) ([]*server.Options, error) {
	n := len(storeDirs)
	if name == "" || n == 0 {
		return nil, fmt.Errorf("natstest: cluster %q of %d nodes: a name and at least one store dir are required", name, n)
	}
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	var routes []*url.URL
	for i := range n {
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", ports[n+i])})
	}
	out := make([]*server.Options, n)
	for i := range n {
		o := Options(storeDirs[i])
		o.ServerName = fmt.Sprintf("N%d", i)
		o.Port = ports[i]
		o.Cluster = server.ClusterOpts{Name: name, Host: "127.0.0.1", Port: ports[n+i]}
		o.Routes = routes
		for _, opt := range opts {
			opt(i, o)
		}
		out[i] = o
	}
	return out, nil
}

// freePorts returns n distinct loopback TCP ports the OS reports free now.
func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("natstest: free port: %w", err)
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

func (c *Cluster) start(i int) {
	c.t.Helper()
	srv, err := server.NewServer(c.opts[i].Clone())
	if err != nil {
		c.t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		c.t.Fatalf("natstest: node %d not ready for connections", i)
	}
	c.servers[i] = srv
}

// Len returns the number of nodes, running or stopped.
func (c *Cluster) Len() int { return len(c.servers) }

// Server returns node i's server, or nil while it is stopped.
func (c *Cluster) Server(i int) *server.Server { return c.servers[i] }

// URL returns node i's client URL, e.g. "nats://127.0.0.1:41234". It stays
// the same across a restart.
func (c *Cluster) URL(i int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", c.opts[i].Port)
}

// URLs returns every node's client URL, comma-separated, as
// DELAYD_NATS_URL and [nats.Connect] take them.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.opts))
	for i := range c.opts {
		urls[i] = c.URL(i)
	}
	return strings.Join(urls, ",")
}

// NodeOf returns the index of the node whose client URL has url's host
// and port (url as [Cluster.URL] gives it, or as nats.go reports a
// connected URL: "nats://127.0.0.1:41234"), or -1 if no node's does.
func (c *Cluster) NodeOf(url string) int {
	hostPort := url
	if i := strings.Index(hostPort, "://"); i >= 0 {
		hostPort = hostPort[i+3:]
	}
	if i := strings.LastIndex(hostPort, "@"); i >= 0 {
		hostPort = hostPort[i+1:]
	}
	for i := range c.opts {
		if hostPort == fmt.Sprintf("127.0.0.1:%d", c.opts[i].Port) {
			return i
		}
	}
	return -1
}

// Connect returns a connection to node i (reconnecting for ever, to any
// node) and its JetStream context; the connection is closed when the test
// ends.
func (c *Cluster) Connect(i int) (*nats.Conn, jetstream.JetStream) {
	c.t.Helper()
	urls := make([]string, len(c.opts))
	for j := range c.opts {
		urls[j] = c.URL(j)
	}
	return ConnectNode(c.t, urls, i)
}

// ConnectNode connects to urls[i] first, then to the others in order, and
// reconnects for ever (100 ms apart) to any of them; it returns the
// connection, closed when the test ends, and its JetStream context. For
// a cluster of nodes whose client URLs are urls (embedded, or nats-server
// processes).
func ConnectNode(t testing.TB, urls []string, i int) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	ordered := []string{urls[i]}
	for j, u := range urls {
		if j != i {
			ordered = append(ordered, u)
		}
	}
	nc, err := nats.Connect(strings.Join(ordered, ","), nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		// As delayd's own connections (cmd/delayd): a hung node is left within 3-4 s.
		nats.PingInterval(time.Second), nats.MaxPingsOutstanding(3), nats.FlusherTimeout(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// Stop shuts node i down and waits until it is down. Stopping a stopped
// node does nothing.
func (c *Cluster) Stop(i int) {
	if s := c.servers[i]; s != nil {
		s.Shutdown()
		s.WaitForShutdown()
		c.servers[i] = nil
	}
}

// Restart starts stopped node i again with its store, ports and routes,
// and waits until the cluster is ready ([Cluster.WaitReady]).
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if c.servers[i] != nil {
		c.t.Fatalf("natstest: node %d is running", i)
	}
	c.start(i)
	c.WaitReady()
}

// StartNode starts stopped node i again with its store, ports and routes,
// and waits only until it accepts connections: unlike [Cluster.Restart] it
// does not wait for the cluster to be ready, so a node can be started
// alone, without a quorum.
func (c *Cluster) StartNode(i int) {
	c.t.Helper()
	if c.servers[i] != nil {
		c.t.Fatalf("natstest: node %d is running", i)
	}
	c.start(i)
}

// WaitReady waits until the cluster is ready ([ClusterReady]); it fails
// the test after [ClusterReadyTimeout].
func (c *Cluster) WaitReady() {
	c.t.Helper()
	deadline := time.Now().Add(ClusterReadyTimeout)
	for time.Now().Before(deadline) {
		if ClusterReady(c.servers) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("natstest: cluster not ready within %s (meta leader node %d)", ClusterReadyTimeout, c.MetaLeader())
}

// ClusterReady reports whether servers (the nodes of one cluster, nil for
// a stopped node) are ready: a JetStream meta leader exists, it sees
// every node as a peer, and every running node is current, as
// nats-server's waitOnClusterReady checks. Poll it with a deadline.
func ClusterReady(servers []*server.Server) bool {
	l := metaLeader(servers)
	if l < 0 || len(servers[l].JetStreamClusterPeers()) != len(servers) {
		return false
	}
	for _, s := range servers {
		if s != nil && !s.JetStreamIsCurrent() {
			return false
		}
	}
	return true
}

// MetaLeader returns the index of the node that is JetStream's meta
// leader, or -1 if none is now.
func (c *Cluster) MetaLeader() int { return metaLeader(c.servers) }

func metaLeader(servers []*server.Server) int {
	for i, s := range servers {
		if s != nil && s.JetStreamIsLeader() {
			return i
		}
	}
	return -1
}

// StreamLeader returns the index of the node that leads stream (in
// [Account]), or -1 if none does now. A KV bucket B is the stream "KV_B".
func (c *Cluster) StreamLeader(stream string) int {
	for i, s := range c.servers {
		if s != nil && s.JetStreamIsStreamLeader(Account, stream) {
			return i
		}
	}
	return -1
}

// BucketLeader returns the index of the node that leads KV bucket's
// stream ("KV_" + bucket), or -1 if none does now.
func (c *Cluster) BucketLeader(bucket string) int {
	return c.StreamLeader("KV_" + bucket)
}

// WaitStreamLeader waits up to [ClusterReadyTimeout] until stream has a
// leader and returns its node's index.
func (c *Cluster) WaitStreamLeader(stream string) int {
	c.t.Helper()
	deadline := time.Now().Add(ClusterReadyTimeout)
	for time.Now().Before(deadline) {
		if l := c.StreamLeader(stream); l >= 0 {
			return l
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("natstest: stream %s has no leader within %s", stream, ClusterReadyTimeout)
	return -1
}

package itest

import (
	"encoding/json"
	"fmt"
	"time"
)

// StoredHeaderBlock returns the header block a stream stored for seq,
// verbatim, read with $JS.API.STREAM.MSG.GET (which returns it base64 and
// leaves it undecoded).
func (b *Bundle) StoredHeaderBlock(stream string, seq uint64) []byte {
	b.T.Helper()
	m, err := b.NC.Request("$JS.API.STREAM.MSG.GET."+stream, fmt.Appendf(nil, `{"seq":%d}`, seq), 5*time.Second)
	if err != nil {
		b.T.Fatal(err)
	}
	var resp struct {
		Message struct {
			Hdrs []byte `json:"hdrs"`
		} `json:"message"`
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		b.T.Fatal(err)
	}
	if resp.Error != nil {
		b.T.Fatalf("stream msg get %s %d: %s", stream, seq, resp.Error.Description)
	}
	return resp.Message.Hdrs
}

package resource

import "errors"

// ErrIngressPartitionsChanged is wrapped by [Setup]'s error when the
// configured ingress partition count differs from the count DELAYD_INGRESS's
// subject transform was set up with while the stream still holds messages
// (deliver.ErrIngressPartitionsChanged, the same value;
// docs/operations.md#ingress-partitions).
var ErrIngressPartitionsChanged = errors.New("DELAYD_INGRESS holds messages stored under another ingress partition count")

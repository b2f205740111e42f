package console

import "context"

// ReadOverview is readOverview, for the tests of package console_test.
func (c *Console) ReadOverview(ctx context.Context) *overviewData { return c.readOverview(ctx) }

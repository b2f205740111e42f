package config

import "errors"

// ErrInvalid is wrapped by every error from [Load] and [Config.Validate] about a bad value.
var ErrInvalid = errors.New("invalid configuration")

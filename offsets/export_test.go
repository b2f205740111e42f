package offsets

// LoseAnswers makes c drop the answer to copy n of its fenced writes (n
// counting every copy from 1) when lose(n) is true, as if the answer were
// held in a hung node's socket: the copy was sent, and applied if the
// server applied it. lose runs on c's write goroutine.
func LoseAnswers(c *Committer, lose func(n uint64) bool) { c.lose = lose }

// LoseBumpAnswers makes s drop the answer to copy n of its own fenced
// writes ([Store.Bump], [Store.CorrectAt]; n counting every copy from 1)
// when lose(n) is true, as [LoseAnswers] does for a Committer's.
func LoseBumpAnswers(s *Store, lose func(n uint64) bool) { s.lose = lose }

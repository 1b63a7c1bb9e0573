package redis

import (
	"context"
	"fmt"
	"log/slog"

	goredis "github.com/redis/go-redis/v9"
)

// SetLogger sends go-redis' internal log (a line for every failed dial) to
// log at debug level: the store's errors already reach the program's log
// and metrics. go-redis has one logger for the whole process, so the last
// call wins.
func SetLogger(log *slog.Logger) {
	goredis.SetLogger(clientLogger{log})
}

// clientLogger is go-redis' logger over slog.
type clientLogger struct{ log *slog.Logger }

func (l clientLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.Debug("redis: " + fmt.Sprintf(format, v...))
}

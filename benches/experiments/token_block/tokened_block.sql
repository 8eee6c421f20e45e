block AS (
    SELECT nextval('lock_tokens') AS first_token WHERE EXISTS (SELECT 1 FROM picked)
), tokened AS (
    SELECT picked.id, block.first_token + picked.ordinal - 1 AS token
    FROM block, picked
)
